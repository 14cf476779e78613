"""A PyTorch DDP job put to sleep and woken as one group: python3 tests/gpu/group_ddp.py --lib LIB

Two ranks over NCCL, one process each, under the shim (LD_PRELOAD=LIB) in one group
(VMMSHIM_LIMIT_GROUP): on GPUs 0 and 1 when two are visible, else both on GPU 0 (NCCL may refuse
two ranks on one GPU: then SKIP). Each rank trains a small model (DistributedDataParallel, SGD,
the same seeds, deterministic algorithms) for STEPS_BEFORE steps, then waits between two steps,
at no collective (it polls a file of this script's), and goes on for STEPS_AFTER steps once told.

The job runs twice. The reference: the ranks are told to go on at once. The second: meanwhile this
script runs `vmmshim ctl --group NAME sleep --mode host --json` and then `wake --json` (the ranks'
memory leaves the device and comes back at the same addresses).
  - PASS/FAIL the group sleep and the group wake: done on both members;
  - PASS/FAIL each rank's losses after the wake equal the reference's. The tolerance is 0: the two
    runs do the same work on the same devices with the same seeds and deterministic algorithms
    (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG), and NCCL's all-reduce of two
    ranks is deterministic for one configuration. When the losses before the sleep already differ
    between the runs (the platform is not deterministic), the tolerance is 1e-6, said in an INFO;
  - INFO the group's times: the command's ms, the slowest member's own move, the phases.

Prints "PASS name" / "FAIL name: why" / "INFO ..." and "group-ddp: N passed, N failed"; exit 0,
1 when a check failed, 77 (a "SKIP why" line) without PyTorch, CUDA or NCCL. Bounded to 90 s."""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from gpu_checks import check, summary, torch_nccl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS_BEFORE = 3
STEPS_AFTER = 3
RUN_S = 40  # each run of the job; two stay under 90 s


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------- a rank

def rank_main(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    res = {"rank": a.rank, "before": [], "after": []}
    try:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.cuda.set_device(a.dev)
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % a.port, rank=a.rank, world_size=2,
                                device_id=torch.device("cuda", a.dev))
        torch.manual_seed(1234)  # the same initial weights on both ranks, in both runs
        model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024)).cuda()
        ddp = DDP(model, device_ids=[a.dev])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator(device="cuda")
        g.manual_seed(100 + a.rank)  # each rank its own data, the same in both runs

        def step():
            x = torch.randn(256, 1024, device="cuda", generator=g)
            y = torch.randn(256, 1024, device="cuda", generator=g)
            opt.zero_grad(set_to_none=False)
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            return float(loss.item())

        for _ in range(STEPS_BEFORE):
            res["before"].append(step())
        torch.cuda.synchronize()
        open(os.path.join(a.dir, "paused.%d" % a.rank), "w").close()
        go = os.path.join(a.dir, "go")
        end = time.monotonic() + RUN_S
        while not os.path.exists(go) and time.monotonic() < end:
            time.sleep(0.01)
        if not os.path.exists(go):
            raise RuntimeError("never told to go on")
        for _ in range(STEPS_AFTER):
            res["after"].append(step())
        torch.cuda.synchronize()
        dist.destroy_process_group()
    except Exception as e:  # reported by the driver
        res["error"] = "%s: %s" % (type(e).__name__, e)
    with open(os.path.join(a.dir, "rank%d.json" % a.rank), "w") as f:
        json.dump(res, f)
    return 0


# ---------------------------------------------------------------- the driver

def ctl(*args):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.run(["sh", os.path.join(ROOT, "scripts", "vmmshim"), "ctl"] + list(args), capture_output=True,
                       text=True, timeout=30, env=env)
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        return p.returncode, {"raw": (p.stdout + p.stderr)[-600:]}


def group_info(what, out):
    own = [(m.get("reply") or {}).get("ms") or 0.0 for m in out.get("members", [])]
    print("INFO %s: %.1f ms for the group, the slowest member moved in %.1f ms (+%.1f ms); phases %s ms" % (
        what, out.get("ms", 0.0), max(own or [0.0]), out.get("ms", 0.0) - max(own or [0.0]),
        json.dumps(out.get("phases_ms"), sort_keys=True)))


def run_job(lib, devices, sleep):
    """One run: the ranks' results (a list of two dicts), or None after a FAIL."""
    name = "sleep" if sleep else "reference"
    d = tempfile.mkdtemp(prefix="vmmshim-gddp-")
    group = "gpu-gddp-%d-%s" % (os.getpid(), name)
    port = free_port()
    env = dict(os.environ, LD_PRELOAD=lib, VMMSHIM_LIMIT_GROUP=group, CUBLAS_WORKSPACE_CONFIG=":4096:8",
               PYTHONPATH=os.pathsep.join([HERE, os.path.join(ROOT, "scripts", "python"),
                                           os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--dev", str(devices[r]),
                               "--port", str(port), "--dir", d], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    t0 = time.monotonic()
    try:
        paused = [os.path.join(d, "paused.%d" % r) for r in range(2)]
        while not all(os.path.exists(p) for p in paused):
            if time.monotonic() - t0 > RUN_S or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        if all(os.path.exists(p) for p in paused) and sleep:
            rc, out = ctl("--group", group, "sleep", "--mode", "host", "--json")
            check(rc == 0 and out.get("ok") and [m["result"] for m in out.get("members", [])] == ["moved"] * 2,
                  "group-sleep", "rc %d: %s" % (rc, json.dumps(out)[:600]))
            group_info("group sleep (host)", out)
            rc, out = ctl("--group", group, "wake", "--json")
            check(rc == 0 and out.get("ok") and [m["result"] for m in out.get("members", [])] == ["moved"] * 2,
                  "group-wake", "rc %d: %s" % (rc, json.dumps(out)[:600]))
            group_info("group wake", out)
        open(os.path.join(d, "go"), "w").close()
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(1.0, RUN_S - (time.monotonic() - t0)))[0] or "")
            except subprocess.TimeoutExpired:
                p.kill()
                logs.append((p.communicate()[0] or "") + " (killed: no end in time)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        try:
            os.unlink("/dev/shm/vmmshim-%d-%s" % (os.geteuid(), group))
        except OSError:
            pass
    res = []
    for r in range(2):
        try:
            with open(os.path.join(d, "rank%d.json" % r)) as f:
                res.append(json.load(f))
        except (OSError, ValueError):
            res.append({"error": "no result; its output: %s" % logs[r][-600:]})
    print("INFO %s run: %.1f s" % (name, time.monotonic() - t0))
    return res


def compare(ref, slept):
    same_before = all(ref[r]["before"] == slept[r]["before"] for r in range(2))
    tol = 0.0 if same_before else 1e-6
    if not same_before:
        print("INFO the losses before the sleep differ between the two runs (%s vs %s): this platform is not "
              "deterministic; the losses after are compared within %g" % (ref[0]["before"], slept[0]["before"], tol))
    for r in range(2):
        a, b = ref[r]["after"], slept[r]["after"]
        ok = len(a) == len(b) == STEPS_AFTER and all(abs(x - y) <= tol for x, y in zip(a, b))
        check(ok, "rank%d/loss-after-wake" % r, "after the wake %s, without the sleep %s (tolerance %g)" % (b, a, tol))
        print("INFO rank %d: losses before %s, after %s (reference %s)" % (r, slept[r]["before"], b, a))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--dev", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--dir")
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a)
    torch, status = torch_nccl(a.lib, "group-ddp")
    if torch is None:
        return status
    devices = [0, 1] if torch.cuda.device_count() >= 2 else [0, 0]
    print("INFO %d GPU(s) visible: two ranks on GPU%s %s" % (torch.cuda.device_count(),
                                                           "s" if devices[1] else "", " and ".join(map(str, devices))))
    ref = run_job(a.lib, devices, False)
    errors = [r.get("error") for r in ref if r.get("error")]
    if errors:
        if devices[0] == devices[1] and any("nccl" in e.lower() for e in errors):
            print("SKIP NCCL does not run two ranks on one GPU here: %s" % errors[0][:200])
            return 77
        check(False, "reference-run", "; ".join(e[:300] for e in errors))
        return summary("group-ddp")
    slept = run_job(a.lib, devices, True)
    errors = [r.get("error") for r in slept if r.get("error")]
    check(not errors, "slept-run", "; ".join(e[:300] for e in errors))
    if not errors:
        compare(ref, slept)
    return summary("group-ddp")


if __name__ == "__main__":
    sys.exit(main())
