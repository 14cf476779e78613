"""vmmshim.torch_memory_saver on the emulation (no GPU, no torch): a program under the shim
allocates through the emulated runtime with ctypes and uses the module as a torch_memory_saver
program would.
  - memory allocated outside every region (and in disable()) keeps its bytes through pause() and
    resume() with no tag; the regions' tags sleep: host mode with enable_cpu_backup, else discard
    (zeros after resume);
  - the CPU backup of a paused block: its bytes, read through vmmshim_host_copy; none when awake;
  - retain_cpu_backup: host memory given back at resume unless set;
  - memory_margin_bytes: a limit that fails an allocation past the margin (one the pool's idle
    memory could serve too), removed by 0;
  - the options torch_memory_saver takes: hook_mode, cpu_backup_backend, a pause of a tag nothing
    was allocated in;
  - disk backup: set_disk_backup_dir refuses what is not a writable directory and creates
    nothing; a region with enable_disk_backup pauses to one file there (its bytes counted on
    disk), resume() brings every byte back and removes it; enable_cpu_backup with
    enable_disk_backup is refused; get_cpu_backup of a tensor on disk is None;
  - get_cpu_backup(x, zero_copy=True), with a stand-in for torch: a tensor over the shim's host
    buffer itself (its address the buffer's, the same for two calls), showing what the device
    wrote before the pause; alive at resume(): a warning, and the host memory under it kept
    (retain_cpu_backup off), given back once it is gone; a tensor over two host buffers (96 MiB),
    or with the driver refusing the CPU access: a copy with a warning; None when awake;
  - configure_subprocess(): a child sees LD_PRELOAD with the shim, the parent's is restored;
  - `vmmshim --as torch_memory_saver` and VMMSHIM_AS=torch_memory_saver: `import
    torch_memory_saver` is this module, in a program run by the launcher."""
import json
import os
import subprocess
import sys

from harness import EMU, LAUNCHER, LIB, PYDIR, check, scratch, summary

SHIM_ENV = dict(os.environ, LD_PRELOAD=LIB, LD_LIBRARY_PATH=EMU, PYTHONPATH=PYDIR)

PROGRAM = r"""
import ctypes, json, os, subprocess, sys
ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
rt = ctypes.CDLL(None)
rt.cudaSetDevice(0)
import vmmshim
from vmmshim import torch_memory_saver as module
from vmmshim.torch_memory_saver import torch_memory_saver as tms
MiB = 1 << 20
def malloc(n):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))
    return p.value if rc == 0 else None
def fill(p, n, c): ctypes.memset(p, c, n)
def same(p, n, c): return ctypes.string_at(p, n) == bytes([c]) * n
out = {"enabled": tms.enabled}
outside = malloc(1 * MiB); fill(outside, 1 * MiB, 0x11)
with tms.region():
    dflt = malloc(4 * MiB)
    with tms.disable():
        kept = malloc(1 * MiB)
    out["tag_after_disable"] = vmmshim.get_tag()
fill(dflt, 4 * MiB, 0x22); fill(kept, 1 * MiB, 0x44)
with tms.region("kv", enable_cpu_backup=True, cpu_backup_backend="pinned"):
    kv = malloc(4 * MiB)
fill(kv, 4 * MiB, 0x33)
out["tag_after"] = vmmshim.get_tag()
tms.pause()
st = vmmshim.tag_stats()
out["paused"] = [st["default"]["discarded"] >= 4 * MiB, st["kv"]["host_copied"] >= 4 * MiB,
                 st["untagged"]["asleep"], st["untagged"]["live"] >= 2 * MiB]
out["outside_kept"] = [same(outside, 1 * MiB, 0x11), same(kept, 1 * MiB, 0x44)]
# The CPU backup, copied with memmove here: the emulated device's memory is the process's.
module._device_to_host = lambda dst, src, n: ctypes.memmove(dst, src, n)
buf = ctypes.create_string_buffer(4 * MiB)
out["backup"] = module._backup_into(kv + 4096, 4 * MiB - 4096, ctypes.addressof(buf)) and \
    buf.raw[:4 * MiB - 4096] == b"\x33" * (4 * MiB - 4096)
out["backup_discarded"] = module._backup_into(dflt, 4096, ctypes.addressof(buf))
out["backup_awake"] = module._backup_into(outside, 4096, ctypes.addressof(buf))
tms.pause()                  # paused already: nothing to do
tms.pause("never-used")      # no such tag: nothing to do
tms.resume()
out["resumed"] = [same(kv, 4 * MiB, 0x33), same(dflt, 4 * MiB, 0), same(outside, 1 * MiB, 0x11)]
out["host_after_resume"] = list(vmmshim.host_memory())
tms.retain_cpu_backup = True
tms.pause("kv"); tms.resume("kv")
out["host_retained"] = vmmshim.host_memory()[1] >= 4 * MiB and same(kv, 4 * MiB, 0x33)
import tempfile
ddir = tempfile.mkdtemp(prefix="vmmshim-tms-disk-")
tms.set_disk_backup_dir(ddir)
out["disk_dir_made_nothing"] = os.listdir(ddir) == []
with tms.region("ondisk", enable_disk_backup=True):
    dk = malloc(6 * MiB + 100)
fill(dk, 6 * MiB + 100, 0x55)
tms.pause("ondisk")
st = vmmshim.tag_stats()["ondisk"]
files = os.listdir(ddir)
out["disk_paused"] = [st["disk"] >= 6 * MiB, st["asleep"], len(files) == 1,
                      all(f.startswith("vmmshim-") and "-ondisk-" in f for f in files)]
out["disk_backup"] = module._backup_into(dk, 4096, ctypes.addressof(buf))
tms.resume("ondisk")
out["disk_resumed"] = [same(dk, 6 * MiB + 100, 0x55), os.listdir(ddir)]
os.rmdir(ddir)
tms.hook_mode = "torch"
out["hook_mode"] = tms.hook_mode
errors = {}
for name, call in [("hook_mode", lambda: setattr(tms, "hook_mode", "other")),
                   ("disk_both", lambda: tms.region(enable_cpu_backup=True, enable_disk_backup=True).__enter__()),
                   ("disk_dir", lambda: tms.set_disk_backup_dir("/nonexistent/vmmshim")),
                   ("disk_dir_file", lambda: tms.set_disk_backup_dir(sys.executable)),
                   ("backend", lambda: tms.region(cpu_backup_backend="mmap").__enter__())]:
    try:
        call()
        errors[name] = "none"
    except Exception as e:
        errors[name] = type(e).__name__
out["errors"] = errors
hole = malloc(256 * MiB)
rt.cudaFree(ctypes.c_void_p(hole))   # idle: cudaMemGetInfo counts it free, a reuse maps nothing
free = ctypes.c_size_t(); total = ctypes.c_size_t()
rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
tms.memory_margin_bytes = free.value - 100 * MiB   # about 100 MiB may still be allocated
limit = vmmshim.control(os.getpid()).status()["limit"]
big = malloc(256 * MiB)
small = malloc(32 * MiB)
tms.memory_margin_bytes = 0
out["margin"] = [limit > 0, big is None, small is not None, vmmshim.control(os.getpid()).status()["limit"],
                 malloc(256 * MiB) is not None, tms.memory_margin_bytes]
before = os.environ.get("LD_PRELOAD")
os.environ["LD_PRELOAD"] = "/nonexistent/other.so"
with module.configure_subprocess():
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'])"],
                           capture_output=True, text=True).stdout.strip()
out["subprocess"] = [child, os.environ["LD_PRELOAD"], vmmshim.library_path()]
os.environ["LD_PRELOAD"] = before
# get_cpu_backup with a stand-in for torch (last: region() would look for its pools).
with tms.region("wide", enable_cpu_backup=True):
    wide = malloc(96 * MiB)
fill(wide, 96 * MiB, 0x77)
import types, warnings
def warned(fn, *args, **kw):  # fn's result and the warnings it gave
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        return fn(*args, **kw), said
class Cpu:
    def __init__(self, n):
        self.buf = ctypes.create_string_buffer(n)
    def data_ptr(self): return ctypes.addressof(self.buf)
    def view(self, _): return self
class Over:  # torch.frombuffer: a tensor over the buffer's memory, which it keeps alive
    def __init__(self, buf): self.buf = buf
    def data_ptr(self): return ctypes.addressof(self.buf)
    def view(self, _): return self
class Cuda:
    is_cuda, dtype = True, "uint8"
    def __init__(self, p, n): self.p, self.n, self.shape = p, n, (n,)
    def is_contiguous(self): return True
    def numel(self): return self.n
    def element_size(self): return 1
    def data_ptr(self): return self.p
sys.modules["torch"] = types.SimpleNamespace(empty=lambda n, dtype: Cpu(n), uint8="uint8",
                                             frombuffer=lambda b, dtype: Over(b))
cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemsetD8_v2(ctypes.c_uint64(kv), ctypes.c_ubyte(0x66), ctypes.c_size_t(4 * MiB))  # the device writes
cu.cuCtxSynchronize()
tms.pause("kv")
home = vmmshim.host_copy(kv)[0]
zc = tms.get_cpu_backup(Cuda(kv, 4 * MiB), zero_copy=True)
zc2 = tms.get_cpu_backup(Cuda(kv, 4 * MiB), zero_copy=True)
out["zero_copy"] = [isinstance(zc, Over), zc is not None and bytes(zc.buf) == b"\x66" * (4 * MiB),
                    zc is not None and zc.data_ptr() == home, zc2 is not None and zc2.data_ptr() == zc.data_ptr()]
tms.retain_cpu_backup = False
_, said = warned(tms.resume, "kv")
out["zero_copy_resume"] = [len(said) == 1 and "still live" in str(said[0].message), vmmshim.host_memory()[1] >= 4 * MiB]
del zc, zc2
tms.pause("kv"); tms.resume("kv")
out["zero_copy_gone"] = list(vmmshim.host_memory())
tms.pause("wide")
zw, said = warned(tms.get_cpu_backup, Cuda(wide, 96 * MiB), zero_copy=True)
out["zero_copy_wide"] = [isinstance(zw, Cpu) and zw.buf.raw[:96 * MiB] == b"\x77" * (96 * MiB),
                         len(said) == 1 and "two of the shim's host buffers" in str(said[0].message)]
del zw
tms.resume("wide")
cu.emu_set_host_cpu_access(0)  # buffers made from now on: the device's only
tms.pause("kv")
zn, said = warned(tms.get_cpu_backup, Cuda(kv, 4 * MiB), zero_copy=True)
out["zero_copy_refused"] = [isinstance(zn, Cpu) and zn.buf.raw[:4 * MiB] == b"\x66" * (4 * MiB),
                            len(said) == 1 and "no access" in str(said[0].message)]
tms.resume("kv")
out["zero_copy_awake"] = tms.get_cpu_backup(Cuda(kv, 4 * MiB), zero_copy=True) is None
print(json.dumps(out))
"""

# A stand-in for torch with PyTorch 2.11's rules on its caching allocator's pools: one
# use_mem_pool per pool at a time, all threads together (a RuntimeError), and a MemPool destroyed
# while any use_mem_pool is under way aborts the process (here: noted in "aborts").
POOLS_PROGRAM = r"""
import contextlib, ctypes, json, sys, threading, types
ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(None).cudaSetDevice(0)
underway, aborts, made, dropped = [], [], [], []
class MemPool:
    def __init__(self):
        self.id = len(made)
        made.append(self.id)
    def __del__(self):
        dropped.append(self.id)
        if underway:
            aborts.append("pool %d destroyed while %s under way" % (self.id, underway))
@contextlib.contextmanager
def use_mem_pool(pool):
    if pool.id in underway:
        raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
    underway.append(pool.id)
    try:
        yield
    finally:
        underway.remove(pool.id)
cuda = types.SimpleNamespace(MemPool=MemPool, use_mem_pool=use_mem_pool, is_available=lambda: True,
                             current_device=lambda: 0)
sys.modules["torch"] = types.SimpleNamespace(cuda=cuda)
from vmmshim.torch_memory_saver import torch_memory_saver as tms
out = {}
with tms.region("kv"):
    with tms.disable():
        pass
    with tms.region("kv"):          # nested in its own kind: another pool
        out["nested"] = list(underway)
    out["disable_dropped_inside"] = list(dropped)
out["disable_dropped_after"] = list(dropped)
with tms.region("kv"):             # the region's pools are kept, and used again
    pass
inside, leave = threading.Event(), threading.Event()
def other():
    with tms.region("kv"):
        inside.set()
        leave.wait(10)
t = threading.Thread(target=other)
t.start()
inside.wait(10)
with tms.disable():                # another thread's region is under way
    pass
out["while_other"] = list(dropped)
leave.set()
t.join()
out["after_other"] = list(dropped)
try:
    with tms.disable():
        raise KeyError("x")
except KeyError:
    pass
out.update(made=list(made), aborts=aborts, underway=list(underway), left=tms._underway)
print(json.dumps(out))
"""


AS_PROGRAM = r"""
import json, torch_memory_saver
from torch_memory_saver import torch_memory_saver as tms, TorchMemorySaver
import vmmshim.torch_memory_saver as ours
print(json.dumps([torch_memory_saver.torch_memory_saver is ours.torch_memory_saver,
                  TorchMemorySaver is ours.TorchMemorySaver, tms.enabled]))
"""


def run(script, tmp, env, argv=()):
    path = os.path.join(tmp, "app.py")
    with open(path, "w") as f:
        f.write(script)
    r = subprocess.run(list(argv) + [sys.executable, path], capture_output=True, text=True, timeout=120, env=env)
    try:
        return r, json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return r, None


def module():
    with scratch("vmmshim-tms-") as tmp:
        r, o = run(PROGRAM, tmp, SHIM_ENV)
        check(r.returncode == 0 and o,
              "the program runs under the shim%s" % ("" if o else " [%s]" % (r.stdout + r.stderr)[-800:]))
        if not o:
            return
        check(o["enabled"] is True, "enabled: the shim is loaded")
        check(o["tag_after_disable"] == "default" and o["tag_after"] == "untagged",
              "disable() restores the region's tag, a region the untagged one %r" % [o["tag_after_disable"],
                                                                                    o["tag_after"]])
        check(o["paused"] == [True, True, False, True], "pause(): region tags asleep, untagged not %r" % o["paused"])
        check(o["outside_kept"] == [True, True], "memory outside regions and in disable() keeps its bytes")
        check(o["backup"] is True, "the CPU backup of a paused block: its bytes, from an offset")
        check(o["backup_discarded"] is False and o["backup_awake"] is False, "no backup: discarded, or awake")
        check(o["resumed"] == [True, True, True], "resume(): backup bytes back, discarded ones zeros, outside intact")
        check(o["host_after_resume"] == [0, 0], "host memory given back at resume %r" % o["host_after_resume"])
        check(o["host_retained"] is True, "retain_cpu_backup: host memory kept")
        check(o["hook_mode"] == "torch", "hook_mode accepted")
        check(o["errors"] == {"hook_mode": "ValueError", "disk_both": "ValueError", "disk_dir": "ValueError",
                              "disk_dir_file": "ValueError", "backend": "ValueError"},
              "bad settings refused: CPU and disk backup together, a disk directory that is not one %r" % o["errors"])
        check(o["disk_dir_made_nothing"] is True, "set_disk_backup_dir creates nothing")
        check(o["disk_paused"] == [True, True, True, True], "a disk-backup region pauses to one file %r" % o["disk_paused"])
        check(o["disk_backup"] is False, "get_cpu_backup of a tensor on disk: none")
        check(o["disk_resumed"] == [True, []], "resume(): every byte back, the file removed %r" % o["disk_resumed"])
        check(o["zero_copy"] == [True, True, True, True],
              "get_cpu_backup(zero_copy=True): the device's bytes, over the shim's host buffer, no copy %r" %
              o["zero_copy"])
        check(o["zero_copy_resume"] == [True, True], "a view alive at resume(): a warning, its host memory kept %r" %
              o["zero_copy_resume"])
        check(o["zero_copy_gone"] == [0, 0], "... given back at a resume() once it is gone %r" % o["zero_copy_gone"])
        check(o["zero_copy_wide"] == [True, True], "over two host buffers: a copy, a warning %r" % o["zero_copy_wide"])
        check(o["zero_copy_refused"] == [True, True], "no CPU access to host buffers: a copy, a warning %r" %
              o["zero_copy_refused"])
        check(o["zero_copy_awake"] is True, "get_cpu_backup of an awake tensor: None")
        m = o["margin"]
        check(m[:3] == [True, True, True], "memory_margin_bytes: a limit; past the margin fails, below it not %r" % m)
        check(m[3:] == [0, True, 0], "memory_margin_bytes = 0: no limit %r" % m)
        child, after, lib = o["subprocess"]
        check(child == lib + ":/nonexistent/other.so" and after == "/nonexistent/other.so" and
              os.path.samefile(lib, LIB), "configure_subprocess: the child has the shim first [%s]" % child)


def pools():
    with scratch("vmmshim-tms-pools-") as tmp:
        r, o = run(POOLS_PROGRAM, tmp, SHIM_ENV)
        check(r.returncode == 0 and o, "the program with PyTorch's pool rules runs%s" % (
            "" if o else " [%s]" % (r.stdout + r.stderr)[-800:]))
        if not o:
            return
        check(o["aborts"] == [] and o["underway"] == [] and o["left"] == 0,
              "no pool destroyed while a use_mem_pool is under way %r" % o["aborts"])
        check(o["nested"] == [0, 2], "a region nested in its own tag routes into another pool %r" % o["nested"])
        check(o["disable_dropped_inside"] == [] and o["disable_dropped_after"] == [1],
              "disable()'s pool is dropped once the region around it ends %r" % o)
        check(o["while_other"] == [1] and o["after_other"] == [1, 3],
              "... once another thread's region ends %r" % [o["while_other"], o["after_other"]])
        check(o["made"] == [0, 1, 2, 3, 4], "the regions' pools are kept and used again, disable() makes one "
              "each, one kept after an exception %r" % o["made"])


def launcher():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH", "VMMSHIM_AS")}
    env.update(LD_LIBRARY_PATH=EMU, VMMSHIM_LIB=LIB)
    with scratch("vmmshim-tms-as-") as tmp:
        r, o = run(AS_PROGRAM, tmp, env, [LAUNCHER, "-q", "--no-trace", "--as", "torch_memory_saver"])
        check(r.returncode == 0 and o == [True, True, True],
              "vmmshim --as torch_memory_saver: the module %r%s" % (o, "" if o else (r.stdout + r.stderr)[-600:]))
        r, o = run(AS_PROGRAM, tmp, dict(env, VMMSHIM_AS="torch_memory_saver"), [LAUNCHER, "-q", "--no-trace"])
        check(r.returncode == 0 and o == [True, True, True],
              "VMMSHIM_AS=torch_memory_saver: the module %r%s" % (o, "" if o else (r.stdout + r.stderr)[-600:]))
        r, o = run(AS_PROGRAM, tmp, env, [LAUNCHER, "-q", "--no-trace"])
        check(r.returncode != 0 and "torch_memory_saver" in r.stderr, "without --as, no such module")
        r = subprocess.run([LAUNCHER, "--as", "nothing", "true"], capture_output=True, text=True, env=env)
        check(r.returncode == 125 and "nothing" in r.stderr, "--as an unknown name: refused [%s]" % r.stderr.strip())


if __name__ == "__main__":
    module()
    pools()
    launcher()
    sys.exit(summary())
