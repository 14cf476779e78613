"""The residue of a PyTorch DDP program over NCCL: python3 tests/gpu/residue_ddp.py --lib LIB

Two ranks (torch.multiprocessing, spawn), every one under the shim (this script runs itself again
with LD_PRELOAD=LIB, and the ranks inherit it): on GPUs 0 and 1 when two are visible, else both on
GPU 0 (NCCL may refuse two ranks on one GPU: then SKIP). Each rank all-reduces a tensor, runs a
matmul (cuBLAS's workspace), captures and replays a CUDA graph holding a memory node
(cudaMallocAsync and cudaFreeAsync in the capture), then sleeps every tag (host mode) and reads
vmmshim.residue():
  - INFO the residue by owner, the libraries and the largest sites;
  - PASS/FAIL NCCL's own memory is named under a library called libnccl*;
  - PASS/FAIL the captured graph's memory is counted as graph memory;
  - INFO where cuBLAS's workspace is (PyTorch makes it through its allocator: in the pools);
then wakes and all-reduces again: PASS/FAIL the same result. With VMMSHIM_SLEEP_FOREIGN=libnccl*
(when the shim has that option) the run is made again: INFO how much of NCCL's memory left the
device and how much was exported (skipped), PASS/FAIL the all-reduce after the wake. Two more
foreign runs change NCCL's configuration (p2p-off: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=0;
cumem-off: NCCL_CUMEM_ENABLE=0): INFO the libraries' VMM bytes awake and asleep (what foreign
sleep moved, and its share), PASS/FAIL the all-reduce after the wake.
Every run: INFO per rank the context and modules (measured), the inferred part (NVML's figure of
the process less every measured owner) and what stays unexplained; PASS/FAIL
unexplained-under-10-percent of what the device uses. Sites print as LIBRARY+0xOFFSET (SYMBOL).

Prints "PASS name" / "FAIL name: why" / "INFO ..." and "residue-ddp: N passed, N failed"; exit 0,
1 when a check failed, 77 (a "SKIP why" line) without PyTorch, CUDA or NCCL. Bounded to 90 s
(four runs of at most 20 s each)."""
import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import time

from gpu_checks import check, summary, torch_nccl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "python"))
MiB = 1 << 20
N = 1 << 20  # elements all-reduced


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def graph_with_memory_node(torch):
    """A captured graph whose capture holds a cudaMallocAsync of 64 MiB and its free: graph memory."""
    rt = ctypes.CDLL("libcudart.so.13") if os.path.exists("/usr/local/cuda/lib64/libcudart.so.13") else None
    if rt is None:
        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                rt = ctypes.CDLL(name)
                break
            except OSError:
                continue
    if rt is None:
        return None, "no libcudart to call cudaMallocAsync"
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    x = torch.ones(1024, device="cuda")
    with torch.cuda.stream(s):
        g.capture_begin()
        p = ctypes.c_void_p()
        rc = rt.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(64 * MiB), ctypes.c_void_p(s.cuda_stream))
        y = x * 2
        if rc == 0:
            rt.cudaFreeAsync(p, ctypes.c_void_p(s.cuda_stream))
        g.capture_end()
    g.replay()
    torch.cuda.synchronize()
    return (g, y), None if rc == 0 else "cudaMallocAsync in the capture: error %d" % rc


def worker(rank, world, port, devices, out_dir):
    import torch
    import torch.distributed as dist
    import vmmshim
    dev = devices[rank]
    torch.cuda.set_device(dev)
    res = {"rank": rank}
    try:
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                                device_id=torch.device("cuda", dev))
        x = torch.full((N,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        res["sum_before"] = float(x[0].item())
        a = torch.randn(1024, 1024, device="cuda")
        (a @ a).sum().item()  # cuBLAS makes its workspace
        keep, why = graph_with_memory_node(torch)
        res["graph_note"] = why or ""
        torch.cuda.synchronize()
        res["awake"] = vmmshim.residue()
        t0 = time.monotonic()
        r = vmmshim.sleep(None, "host")
        res["sleep_s"] = time.monotonic() - t0
        res["slept"] = {"released": r.released, "skipped": r.skipped, "reason": r.reason, "to_host": r.to_host}
        res["residue"] = vmmshim.residue()
        t0 = time.monotonic()
        vmmshim.wake(None)
        res["wake_s"] = time.monotonic() - t0
        y = torch.full((N,), float(rank + 1), device="cuda")
        dist.all_reduce(y)
        dist.all_reduce(x)  # the tensor that slept, reduced again
        torch.cuda.synchronize()
        res["sum_after"] = float(y[0].item())
        res["sum_slept"] = float(x[0].item())
        del keep
        dist.destroy_process_group()
    except Exception as e:  # reported by the driver as a failure or a skip
        res["error"] = "%s: %s" % (type(e).__name__, e)
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(res, f)


def run_ranks(foreign, label):
    """In the process under the shim: two ranks; prints one JSON line of their results."""
    import tempfile
    import torch
    import torch.multiprocessing as mp
    n = torch.cuda.device_count()
    devices = [0, 1] if n >= 2 else [0, 0]
    out_dir = tempfile.mkdtemp(prefix="residue-ddp-")
    mp.spawn(worker, args=(2, free_port(), devices, out_dir), nprocs=2, join=True)
    ranks = []
    for r in range(2):
        with open(os.path.join(out_dir, "rank%d.json" % r)) as f:
            ranks.append(json.load(f))
    print("RANKS " + json.dumps({"gpus": n, "devices": devices, "foreign": foreign, "label": label, "ranks": ranks}))


def nccl_of(res):
    return [lb for lb in res["residue"]["libraries"] if lb["name"].startswith("libnccl")]


def libraries_on_device(res):
    return sum(d["owners"]["libraries"] for d in res["devices"])


def report_owners(tag, res):
    """The context, modules and what stays unexplained: PASS when under a tenth of what is used."""
    for d in res["devices"]:
        o = d["owners"]
        print("INFO %s device %d: context %.1f MiB, modules %.1f MiB (measured around their creation), inferred "
              "%.1f MiB (this process by NVML %.1f MiB less every measured owner), unexplained %.1f MiB of %.1f MiB "
              "used" % (tag, d["device"], o.get("context", 0) / MiB, o.get("modules", 0) / MiB,
                        o.get("inferred", 0) / MiB, d.get("process", 0) / MiB, o["unexplained"] / MiB,
                        d["used"] / MiB))
        if d["measured"]:
            check(abs(o["unexplained"]) < d["used"] / 10, "%s/unexplained-under-10-percent" % tag,
                  "device %d: %.1f MiB unexplained of %.1f MiB used (note: %s)" % (
                      d["device"], o["unexplained"] / MiB, d["used"] / MiB, res["note"] or "-"))


def report(run, foreign):
    same_gpu = run["devices"][0] == run["devices"][1]
    label = run.get("label") or ("foreign" if foreign else "")
    for r in run["ranks"]:
        tag = "%srank%d" % (label + "-" if label else "", r["rank"])
        if "error" in r:
            if same_gpu and "Duplicate GPU" in r["error"]:
                print("INFO %s: NCCL refuses two ranks on one GPU (%s)" % (tag, r["error"][:200]))
                return "skip"
            check(False, "%s/ran" % tag, r["error"][:300])
            continue
        res = r["residue"]
        for d in res["devices"]:
            o = d["owners"]
            print("INFO %s device %d: used %.1f MiB of %.1f MiB; tags %.1f, libraries %.1f, managed %.1f, graphs "
                  "%.1f, other processes %.1f, unexplained %.1f MiB" % (
                      tag, d["device"], d["used"] / MiB, d["total"] / MiB, o["tags"] / MiB, o["libraries"] / MiB,
                      o["managed"] / MiB, o["graphs"] / MiB, o["other_processes"] / MiB, o["unexplained"] / MiB))
        for lb in res["libraries"]:
            print("INFO %s library %s: VMM %.1f MiB, managed %.1f MiB, pinned host %.1f MiB" % (
                tag, lb["name"], lb["vmm"] / MiB, lb["managed"] / MiB, lb["host"] / MiB))
        for s in res["sites"][:4]:
            print("INFO %s site %s+%s%s: %.1f MiB (%s)" % (
                tag, s["library"], s.get("offset", s["address"]), (" (%s)" % s["symbol"]) if s.get("symbol") else "",
                s["bytes"] / MiB, s["kind"]))
        report_owners(tag, res)
        print("INFO %s: exported or imported %.1f MiB; note: %s; sleep released %.1f MiB, skipped %.1f MiB (%s)" % (
            tag, res["shared"] / MiB, res["note"] or "-", r["slept"]["released"] / MiB, r["slept"]["skipped"] / MiB,
            r["slept"]["reason"] or "-"))
        nccl = nccl_of(r)
        if not foreign:
            check(bool(nccl) and nccl[0]["vmm"] > 0, "%s/nccl-named" % tag,
                  "no libnccl* library with VMM memory in the residue: %s" % res["libraries"])
            graphs = sum(d["owners"]["graphs"] for d in res["devices"])
            check(graphs >= 64 * MiB or bool(r.get("graph_note")), "%s/graph-memory-counted" % tag,
                  "graph memory %d bytes after a capture with a 64 MiB node" % graphs)
            if r.get("graph_note"):
                print("INFO %s: %s" % (tag, r["graph_note"]))
            print("INFO %s: cuBLAS's workspace comes from PyTorch's allocator: it is in the pools (tags %.1f MiB)" % (
                tag, sum(d["owners"]["tags"] for d in res["devices"]) / MiB))
        else:
            left = sum(lb["vmm"] for lb in nccl)
            awake = libraries_on_device(r["awake"]) if "awake" in r else 0
            print("INFO %s: NCCL's VMM memory on the device while asleep: %.1f MiB (exported, skipped: %.1f MiB)" % (
                tag, left / MiB, res["shared"] / MiB))
            host = r["slept"].get("to_host", 0)
            print("INFO %s: sleep of every tag copied %.1f MiB to host in %.1f ms (%.2f GiB/s), wake %.1f ms" % (
                tag, host / MiB, r.get("sleep_s", 0) * 1e3, host / (1 << 30) / r["sleep_s"] if r.get("sleep_s") else 0.0,
                r.get("wake_s", 0) * 1e3))
            print("INFO %s: libraries' VMM memory on the device: %.1f MiB awake, %.1f MiB asleep: foreign sleep moved "
                  "%.1f MiB (%.0f %%)" % (tag, awake / MiB, libraries_on_device(res) / MiB,
                                          (awake - libraries_on_device(res)) / MiB,
                                          100.0 * (awake - libraries_on_device(res)) / awake if awake else 0.0))
        check(r["sum_before"] == 3.0 and r["sum_after"] == 3.0 and r["sum_slept"] == 6.0,
              "%s/all-reduce-after-wake" % tag, "sums %s, %s, %s (3, 3, 6 expected)" % (
                  r["sum_before"], r["sum_after"], r["sum_slept"]))
    return "ok"


# NCCL configurations run with foreign sleep on, to measure how much of NCCL's memory it can move:
# NCCL exports the cuMem handles it makes for peer access, which foreign sleep leaves; without
# P2P (shared memory between the ranks instead) or without cuMem (NCCL_CUMEM_ENABLE=0: NCCL's
# buffers come from cudaMalloc, which the shim serves) less of it may be exported.
VARIANTS = (("p2p-off", {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"}),
            ("cumem-off", {"NCCL_CUMEM_ENABLE": "0"}))
RUN_LIMIT = 20  # seconds a run may take: four runs stay under 90 s


def drive(lib, foreign, label="", extra=None):
    env = dict(os.environ, LD_PRELOAD=lib, PYTHONPATH=os.pathsep.join(
        [HERE, os.path.join(ROOT, "scripts", "python"), os.environ.get("PYTHONPATH", "")]))
    if foreign:
        env["VMMSHIM_SLEEP_FOREIGN"] = "libnccl*"
    env.update(extra or {})
    name = label or ("foreign" if foreign else "")
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--ranks", "--label", name] +
                           (["--foreign"] if foreign else []), env=env, capture_output=True, text=True,
                           timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-800:]
        check(False, "%sranks" % (name + "-" if name else ""), "no result within %d s: %r" % (RUN_LIMIT, out))
        return None
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RANKS ")]
    if not line:
        check(False, "%sranks" % (name + "-" if name else ""), "exit %d, no result; %s" % (
            p.returncode, (p.stdout + p.stderr)[-800:]))
        return None
    print("INFO %sruns took %.1f s%s" % (name + " " if name else "", time.monotonic() - t0,
                                         "".join(" %s=%s" % kv for kv in sorted((extra or {}).items()))))
    return json.loads(line[0][6:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("--ranks", action="store_true")
    ap.add_argument("--foreign", action="store_true")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.ranks:
        run_ranks(args.foreign, args.label)
        return 0
    torch, status = torch_nccl(args.lib, "residue-ddp")
    if torch is None:
        return status
    print("INFO %d GPU(s) visible: %s" % (torch.cuda.device_count(), "two ranks on GPUs 0 and 1"
                                           if torch.cuda.device_count() >= 2 else "two ranks on GPU 0"))
    run = drive(args.lib, False)
    if run is None or report(run, False) == "skip":
        if run is not None:
            print("SKIP NCCL does not run two ranks on one GPU here")
            return 77
        return summary("residue-ddp")
    strings = subprocess.run(["grep", "-c", "VMMSHIM_SLEEP_FOREIGN", args.lib], capture_output=True, text=True)
    if strings.stdout.strip() not in ("", "0"):
        run = drive(args.lib, True)
        if run is not None:
            report(run, True)
        for label, extra in VARIANTS:
            run = drive(args.lib, True, label, extra)
            if run is not None:
                report(run, True)
    else:
        print("INFO this shim has no VMMSHIM_SLEEP_FOREIGN: NCCL's own memory stays on the device while asleep")
    return summary("residue-ddp")


if __name__ == "__main__":
    sys.exit(main())
