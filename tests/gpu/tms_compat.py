"""A torch_memory_saver program on the shim: python3 tests/gpu/tms_compat.py --lib LIB [--no-cache]

The driver (no --child) runs this script again as a program of the launcher, `scripts/vmmshim
--as torch_memory_saver` with VMMSHIM_LIB=LIB, PyTorch's caching allocator on (with --no-cache:
off, PYTORCH_NO_CUDA_MEMORY_CACHING=1). The program imports `torch_memory_saver` (the shim's
compatible module, which the launcher put first) and checks:
  - tensors made before and after the regions (outside every region) are intact after pause()
    and resume() with no tag;
  - a region with enable_cpu_backup: its tensor comes back with every byte; while paused,
    get_cpu_backup(tensor) equals it (zero_copy too), and the device memory was given back;
  - get_cpu_backup(x, zero_copy=True) of a 16 MiB tensor (one host buffer): equal to x, over the
    shim's host buffer itself (vmmshim.host_copy's address), the same memory for two calls, no
    warning; of the 512 MiB one (several 64 MiB buffers): a copy, with a warning (INFO line);
  - a region without backup: its tensor comes back as zeros;
  - a region nested in a region of its own tag, and disable() inside a region (whose pool
    PyTorch forbids destroying while the region's use_mem_pool is under way: an abort): the
    disable()'s tensor is never paused, and its memory goes back to the device once freed;
  - cuda_graph(): a graph captured under a region tag replays to the same result after its
    memory was paused and resumed (caching allocator on only: graphs need it);
  - disk backup: set_disk_backup_dir to a new directory (nothing made there); three region tags
    paused at once in three modes (two with enable_disk_backup, one with enable_cpu_backup, one
    with neither): one file per disk tag while paused (the tag's name in it, at least its bytes
    long), the device memory given back, no CPU backup of a tensor on disk; after resume() the
    disk and host tags' tensors are back, every byte, the other one zeros, and the files are
    gone; INFO lines give the pause and resume times and the directory's filesystem;
  - INFO only: whether host-location VMM memory (what the shim keeps CPU backups in) can be
    given CPU access with cuMemSetAccess, and whether the CPU then reads what the device wrote
    there (what get_cpu_backup(zero_copy=True) relies on);
  - memory_margin_bytes, after torch.cuda.empty_cache() (the margin, as torch_memory_saver's,
    sees only allocations that reach the allocator: blocks PyTorch's cache holds are served
    without it): an allocation that would leave less than the margin free fails (as
    OutOfMemoryError, or without the cache the RuntimeError of PyTorch's cudaMalloc check), one
    below it not; INFO lines give the shim's figures (limit, mapped, idle) around it.

Prints "PASS name" / "FAIL name: why" per check and "tms-compat: N passed, N failed"; exit 0,
1 when a check failed, 77 (with a "SKIP why" line) when PyTorch or its CUDA is not there."""
import argparse
import ctypes
import os
import subprocess
import sys
import warnings

from gpu_checks import check, summary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MiB = 1 << 20

def free_bytes(torch):
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def child():
    import torch
    import torch_memory_saver as tms_module
    from torch_memory_saver import torch_memory_saver as tms
    import vmmshim.torch_memory_saver as ours
    check(tms_module.torch_memory_saver is ours.torch_memory_saver and tms.enabled,
          "import torch_memory_saver is the shim's module, enabled")
    dev = torch.device("cuda")
    before = torch.arange(256 * MiB // 4, dtype=torch.int32, device=dev)      # 256 MiB, outside
    with tms.region(tag="zc", enable_cpu_backup=True):  # a pool of its own: the tensor starts a host buffer
        small = torch.arange(16 * MiB // 4, dtype=torch.int32, device=dev) * 13
    with tms.region(tag="weights", enable_cpu_backup=True):
        weights = torch.arange(512 * MiB // 4, dtype=torch.int32, device=dev) * 3
    with tms.region(tag="kv"):
        kv = torch.full((512 * MiB // 4,), 7, dtype=torch.int32, device=dev)
        with tms.region(tag="kv"):  # its own tag again: a pool serves one use_mem_pool at a time
            kv2 = torch.full((MiB // 4,), 7, dtype=torch.int32, device=dev)
        with tms.disable():  # its pool ends inside kv's use_mem_pool: PyTorch aborts if it is destroyed
            kept = torch.full((256 * MiB // 4,), 5, dtype=torch.int32, device=dev)
    print("INFO torch %s, caching allocator %s" % (torch.__version__, "off" if os.environ.get(
        "PYTORCH_NO_CUDA_MEMORY_CACHING") == "1" else "on"))
    after = torch.arange(64 * MiB // 4, dtype=torch.int32, device=dev) + 11   # outside
    want_before, want_weights, want_after = before.sum().item(), weights.sum().item(), after.sum().item()
    weights_cpu, small_cpu = weights.cpu(), small.cpu()

    free0 = free_bytes(torch)
    tms.pause()
    free1 = free_bytes(torch)
    check(free1 - free0 >= 1000 * MiB, "pause() gave the regions' device memory back",
          "%d MiB more free" % ((free1 - free0) // MiB))
    backup = tms.get_cpu_backup(weights)
    check(backup is not None and backup.device.type == "cpu" and torch.equal(backup, weights_cpu),
          "get_cpu_backup equals the paused tensor")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        zc = tms.get_cpu_backup(weights, zero_copy=True)
    check(zc is not None and torch.equal(zc, weights_cpu), "get_cpu_backup(zero_copy=True) equals it too")
    print("INFO get_cpu_backup(zero_copy=True) of 512 MiB: %s" % (
        "; ".join(str(w.message) for w in said) or "no warning (a view)"))
    del zc
    zero_copy_view(torch, tms, small, small_cpu)
    check(tms.get_cpu_backup(kv) is None, "no CPU backup of a region without one")
    check(before.sum().item() == want_before and after.sum().item() == want_after and
          kept.sum().item() == 5 * (256 * MiB // 4), "memory outside regions and in disable() works while paused")
    tms.resume()
    check(weights.sum().item() == want_weights and torch.equal(small.cpu(), small_cpu),
          "the backed-up regions' tensors are back, every byte")
    check(kv.count_nonzero().item() == 0 and kv2.count_nonzero().item() == 0,
          "the region without backup wakes as zeros")
    check(before.sum().item() == want_before and after.sum().item() == want_after,
          "tensors outside the regions intact after pause/resume")
    check(tms.get_cpu_backup(weights) is None, "no CPU backup once resumed")

    free2 = free_bytes(torch)
    del kept
    torch.cuda.empty_cache()
    free3 = free_bytes(torch)
    check(free3 - free2 >= 200 * MiB, "disable()'s memory goes back to the device once freed",
          "%d MiB more free" % ((free3 - free2) // MiB))

    disk_backup(torch, tms, dev)
    host_vmm_cpu_probe(torch)
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        return finish_margin(torch, tms, dev)
    static_in = torch.ones(16 * MiB // 4, device=dev)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        static_in.mul(2).sum()   # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with tms.cuda_graph(graph, tag="graph"):
        static_out = (static_in * 2).sum()
    graph.replay()
    want = static_out.item()
    tms.pause("graph")
    tms.resume("graph")
    graph.replay()
    check(static_out.item() == want == 2 * (16 * MiB // 4), "a graph captured by cuda_graph() replays after pause")
    return finish_margin(torch, tms, dev)


def zero_copy_view(torch, tms, small, small_cpu):
    """get_cpu_backup(zero_copy=True) of a paused tensor in one host buffer: a view of it."""
    import vmmshim
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        zc = tms.get_cpu_backup(small, zero_copy=True)
        zc2 = tms.get_cpu_backup(small, zero_copy=True)
    where = vmmshim.host_copy(small.data_ptr())
    home = where[0] if where else None
    check(zc is not None and zc2 is not None and torch.equal(zc, small_cpu) and torch.equal(zc2, small_cpu),
          "get_cpu_backup(zero_copy=True) of 16 MiB equals the paused tensor")
    check(zc is not None and zc2 is not None and zc.data_ptr() == zc2.data_ptr() == home and not said,
          "get_cpu_backup(zero_copy=True) is the shim's host buffer itself, no copy",
          "data_ptr 0x%x and 0x%x, host buffer 0x%x; %s" % (zc.data_ptr() if zc is not None else 0,
                                                             zc2.data_ptr() if zc2 is not None else 0, home or 0,
                                                             "; ".join(str(w.message) for w in said)))
    del zc, zc2  # before resume(): a view alive then keeps its host memory (and warns)


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("handles", ctypes.c_int), ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte), ("rdma", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]


def host_vmm_cpu_probe(torch):
    """Prints what the driver answers when host-NUMA VMM memory is given CPU access, and whether
    the CPU then reads bytes the device wrote (in a forked child: a fault ends only it)."""
    cu = ctypes.CDLL("libcuda.so.1")
    dev = torch.cuda.current_device()
    prop = _Prop(type=1, loc_type=3, loc_id=0)  # pinned, CU_MEM_LOCATION_TYPE_HOST_NUMA, node 0
    g, h, va = ctypes.c_size_t(), ctypes.c_ulonglong(), ctypes.c_ulonglong()
    r = cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 0)
    r = r or cu.cuMemCreate(ctypes.byref(h), g, ctypes.byref(prop), ctypes.c_ulonglong(0))
    if r:
        print("INFO host-NUMA VMM memory for a CPU probe: CUDA error %d; not probed" % r)
        return
    size = g.value
    r = cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(0),
                               ctypes.c_ulonglong(0))
    r = r or cu.cuMemMap(va, ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0))
    gpu = _Access(1, dev, 3)
    r = r or cu.cuMemSetAccess(va, ctypes.c_size_t(size), ctypes.byref(gpu), ctypes.c_size_t(1))
    r = r or cu.cuMemsetD8_v2(va, ctypes.c_ubyte(0x5A), ctypes.c_size_t(size)) or cu.cuCtxSynchronize()
    if r:
        print("INFO host-NUMA VMM memory mapped for the device: CUDA error %d; not probed" % r)
    else:
        for name, loc in (("HOST_NUMA node 0", (3, 0)), ("HOST", (2, 0))):
            cpu = (_Access * 2)(_Access(1, dev, 3), _Access(loc[0], loc[1], 3))
            a = cu.cuMemSetAccess(va, ctypes.c_size_t(size), cpu, ctypes.c_size_t(2))
            seen = "not tried"
            if a == 0:
                pid = os.fork()
                if pid == 0:
                    os._exit(0 if ctypes.string_at(va.value, 64) == b"\x5a" * 64 else 1)
                _, status = os.waitpid(pid, 0)
                seen = ("reads what the device wrote" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
                        else "reads other bytes" if os.WIFEXITED(status) else "faults (signal %d)" % os.WTERMSIG(status))
            print("INFO host-NUMA VMM memory, cuMemSetAccess with the device and %s: %s; the CPU %s" % (
                name, "CUDA error %d" % a if a else "accepted", seen))
    cu.cuMemUnmap(va, ctypes.c_size_t(size))
    cu.cuMemRelease(h)
    cu.cuMemAddressFree(va, ctypes.c_size_t(size))


def disk_backup(torch, tms, dev):
    import tempfile
    import time
    import vmmshim
    d = tempfile.mkdtemp(prefix="vmmshim-tms-disk-")
    tms.set_disk_backup_dir(d)
    check(os.listdir(d) == [], "set_disk_backup_dir creates nothing")
    fs = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
    n = 768 * MiB // 4
    with tms.region(tag="disk1", enable_disk_backup=True):
        d1 = torch.arange(n, dtype=torch.int32, device=dev) * 5
    with tms.region(tag="disk2", enable_disk_backup=True):
        d2 = torch.arange(3 * MiB // 4 + 3, dtype=torch.int32, device=dev) - 9   # not whole pages
    with tms.region(tag="host1", enable_cpu_backup=True):
        h1 = torch.arange(n, dtype=torch.int32, device=dev) * 7
    with tms.region(tag="zero1"):
        z1 = torch.full((n,), 3, dtype=torch.int32, device=dev)
    want = [t.sum().item() for t in (d1, d2, h1)]
    free0 = free_bytes(torch)
    t0 = time.perf_counter()
    for tag in ("disk1", "disk2", "host1", "zero1"):
        tms.pause(tag)
    t1 = time.perf_counter()
    files = sorted(os.listdir(d))
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in files}
    st = vmmshim.tag_stats()
    check(len(files) == 2 and any("-disk1-" in f for f in files) and any("-disk2-" in f for f in files),
          "one file per disk tag while paused", "%s" % files)
    check(all(v >= 3 * MiB for v in sizes.values()) and st["disk1"]["disk"] >= 4 * n,
          "the files hold the tags' bytes", "%s, disk1 %d" % (sizes, st["disk1"]["disk"]))
    check(free_bytes(torch) - free0 >= 3 * 4 * n * 9 // 10, "the three tags' device memory was given back")
    check(tms.get_cpu_backup(d1) is None, "no CPU backup of a tensor on disk")
    t2 = time.perf_counter()
    for tag in ("disk1", "disk2", "host1", "zero1"):
        tms.resume(tag)
    t3 = time.perf_counter()
    check([t.sum().item() for t in (d1, d2, h1)] == want, "disk and host tags back, every byte")
    check(z1.count_nonzero().item() == 0, "the tag without backup wakes as zeros")
    check(os.listdir(d) == [], "the files are gone after resume()", "%s" % os.listdir(d))
    print("INFO disk backup in %s (%s): pause of 768 MiB + 3 MiB on disk, 768 MiB host, 768 MiB discard %.1f ms, "
          "resume %.1f ms" % (d, fs or "?", (t1 - t0) * 1e3, (t3 - t2) * 1e3))
    del d1, d2, h1, z1
    os.rmdir(d)


def out_of_memory(torch, e):
    """An allocation refused for memory: the caching allocator raises OutOfMemoryError; without
    it (PYTORCH_NO_CUDA_MEMORY_CACHING=1) PyTorch's check of cudaMalloc raises a RuntimeError
    (AcceleratorError) saying "out of memory"."""
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def try_empty(torch, dev, n):
    """(tensor of n bytes or None, why it failed)."""
    try:
        return torch.empty(n, dtype=torch.uint8, device=dev), ""
    except RuntimeError as e:  # OutOfMemoryError is one too
        if not out_of_memory(torch, e):
            raise
        return None, str(e).splitlines()[0][:120]


def figures(ctl):
    """The shim's own figures, in MiB, for the INFO lines: what the next run shows."""
    st = ctl.status()
    devs = ["dev %d: live %d mapped %d idle %d pending %d" % (d["device"], d["live"] // MiB, d["mapped"] // MiB,
                                                                 d["idle"] // MiB, d["pending"] // MiB)
            for d in st.get("devices", [])]
    stats = st.get("stats", {})
    return "limit %d mapped %d (%s); passed to the driver %s, refused %s" % (
        st["limit"] // MiB, st["mapped"] // MiB, "; ".join(devs), stats.get("passthrough_allocs"),
        stats.get("alloc_failures"))


def finish_margin(torch, tms, dev):
    import vmmshim
    ctl = vmmshim.control(os.getpid())
    torch.cuda.empty_cache()  # blocks PyTorch's cache holds are served without reaching any allocator
    # What the cache still holds free inside segments that also hold live tensors (empty_cache
    # cannot give those back): a request larger than that reaches the allocator, as in
    # torch_memory_saver, whose margin also sees only what reaches it.
    slack = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    big_n = slack + 1024 * MiB
    free = free_bytes(torch)
    tms.memory_margin_bytes = free - 512 * MiB   # about 512 MiB may still be allocated
    print("INFO margin: free %d MiB, margin %d MiB, PyTorch's cache free inside its segments %d MiB; %s" % (
        free // MiB, (free - 512 * MiB) // MiB, slack // MiB, figures(ctl)))
    big, big_why = try_empty(torch, dev, big_n)
    if big is not None:
        print("INFO margin: %d MiB fitted; now free %d MiB, %s" % (big_n // MiB, free_bytes(torch) // MiB, figures(ctl)))
    del big
    small, small_why = try_empty(torch, dev, 64 * MiB)
    tms.memory_margin_bytes = 0
    check(bool(big_why) and small is not None, "memory_margin_bytes: past the margin is out of memory, below it not",
          "%d MiB %s, 64 MiB %s" % (big_n // MiB, big_why or "fitted", small_why or "fitted"))
    return summary("tms-compat")


def driver(lib, no_cache):
    try:
        import torch
        if not torch.cuda.is_available():
            print("SKIP PyTorch finds no CUDA device")
            return 77
    except ImportError:
        print("SKIP PyTorch is not installed")
        return 77
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTORCH_NO_CUDA_MEMORY_CACHING")}
    env["VMMSHIM_LIB"] = lib
    if no_cache:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    r = subprocess.run([os.path.join(ROOT, "scripts", "vmmshim"), "-q", "--no-trace", "--as", "torch_memory_saver",
                        sys.executable, os.path.abspath(__file__), "--child"], env=env, timeout=300)
    return r.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libvmmshim.so"))
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    sys.exit(child() if a.child else driver(os.path.abspath(a.lib), a.no_cache))


if __name__ == "__main__":
    main()
