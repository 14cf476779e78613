"""PyTorch training put to sleep and woken from outside: python3 tests/gpu/torch_sleep.py --lib LIB

A small model (an MLP with Adam) trains STEPS steps with a fixed seed, PyTorch's caching allocator
on (with --no-cache: off, PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every tensor is a block of the
shim's), twice under the shim (LD_PRELOAD=LIB): once straight through, once waiting between steps while
a driver (this script) steers it through vmmshim.control(pid): after step 2 every tag sleeps in
host mode, after step 4 the whole process at level 1 in mapped mode, after step 6 in host mode
again; each time the driver checks the reply (device memory given back) and the status (nothing
of the process left on the device), then wakes it. The losses of the two runs must be
bit-identical (compared as float.hex()).

Prints "PASS name" / "FAIL name: why" per check and "torch-sleep: N passed, N failed"; exit 0,
1 when a check failed, 77 (with a "SKIP why" line) when PyTorch or its CUDA is not there. The
shim library missing, or the vmmshim module not importable, fails.

Roles: without --train, the driver; with --train OUT [--wait-dir DIR], the training run."""
import argparse
import json
import os
import subprocess
import sys

from gpu_checks import check, failures, need_torch_cuda, summary
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 8
PAUSES = {2: ("host", None), 4: ("mapped", 1), 6: ("host", None)}  # step -> (mode, level)

def train(out, wait_dir):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048),
                                torch.nn.GELU(), torch.nn.Linear(2048, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(1)
    data = [(torch.randn(256, 512, generator=gen), torch.randint(0, 10, (256,), generator=gen)) for _ in range(STEPS)]
    losses = []
    for step in range(1, STEPS + 1):
        x, y = data[step - 1][0].to(dev), data[step - 1][1].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # synchronises: nothing of this step runs any more
        if wait_dir and step in PAUSES:
            with open(os.path.join(wait_dir, "step.%d.tmp" % step), "w") as f:
                f.write("%d\n" % os.getpid())
            os.rename(os.path.join(wait_dir, "step.%d.tmp" % step), os.path.join(wait_dir, "step.%d" % step))
            go = os.path.join(wait_dir, "go.%d" % step)
            t0 = time.monotonic()
            while not os.path.exists(go):
                if time.monotonic() - t0 > 120:
                    print("the driver did not say go after step %d" % step, file=sys.stderr)
                    sys.exit(3)
                time.sleep(0.01)
    with open(out, "w") as f:
        json.dump({"losses": [float(v).hex() for v in losses], "pid": os.getpid(),
                   "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}, f)


def run_train(lib, out, wait_dir=None, no_cache=False):
    env = dict(os.environ, LD_PRELOAD=lib)
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    if no_cache:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    args = [sys.executable, os.path.abspath(__file__), "--train", out]
    if wait_dir:
        args += ["--wait-dir", wait_dir]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def drive(lib, work, no_cache):
    need_torch_cuda(lib)
    sys.path.insert(0, os.path.join(ROOT, "scripts", "python"))
    try:
        import vmmshim
    except Exception as e:  # noqa: BLE001
        check(False, "module", "the vmmshim module does not import from scripts/python: %s" % e)
        return
    if failures():
        return
    os.makedirs(work, exist_ok=True)
    for f in os.listdir(work):
        os.unlink(os.path.join(work, f))

    ref_out = os.path.join(work, "reference.json")
    p = run_train(lib, ref_out, no_cache=no_cache)
    log, _ = p.communicate(timeout=300)
    check(p.returncode == 0 and os.path.exists(ref_out), "reference-run", "exit %s: %s" % (p.returncode, log[-800:]))
    if failures():
        return

    out = os.path.join(work, "driven.json")
    p = run_train(lib, out, work, no_cache)
    try:
        for step, (mode, level) in sorted(PAUSES.items()):
            flag = os.path.join(work, "step.%d" % step)
            t0 = time.monotonic()
            while not os.path.exists(flag) and p.poll() is None and time.monotonic() - t0 < 180:
                time.sleep(0.05)
            if not os.path.exists(flag):
                check(False, "step-%d" % step, "the training run did not reach step %d (exit %s)" % (step, p.poll()))
                break
            pid = int(open(flag).read())
            ctl = vmmshim.control(pid)
            before = ctl.status()
            on_device = sum(d["on_device"] for d in before["devices"])
            live = sum(tag["live"] for tag in before["tags"])
            what = "level %d %s" % (level, mode) if level else mode
            started = time.monotonic()
            r = ctl.sleep(mode=mode, level=level)
            took = time.monotonic() - started
            check(r["ok"] and r["released"] >= on_device > 0, "sleep-%d" % step,
                  "sleep (%s): %s; %d bytes were on the device" % (what, json.dumps(r), on_device))
            st = ctl.status()
            left = sum(d["on_device"] for d in st["devices"])
            asleep = sum(tag["host_copied"] + tag["host_mapped"] for tag in st["tags"])
            check(left == 0 and asleep >= live > 0, "asleep-%d" % step,
                  "after the sleep: %d bytes still on the device, %d asleep in host memory, %d live" % (
                      left, asleep, live))
            r = ctl.wake()
            check(r["ok"] and r["restored"] >= asleep, "wake-%d" % step, "wake: %s" % json.dumps(r))
            print("INFO step %d: %s sleep of %.1f MiB in %.1f ms, wake in %.1f ms" % (
                step, what, on_device / 2 ** 20, took * 1e3, r["ms"]))
            open(os.path.join(work, "go.%d" % step), "w").close()
    except vmmshim.ControlError as e:
        check(False, "control", str(e))
        for step in PAUSES:
            open(os.path.join(work, "go.%d" % step), "w").close()
    log, _ = p.communicate(timeout=300)
    check(p.returncode == 0 and os.path.exists(out), "driven-run", "exit %s: %s" % (p.returncode, log[-800:]))
    if not os.path.exists(out):
        return
    ref = json.load(open(ref_out))["losses"]
    got = json.load(open(out))["losses"]
    check(len(ref) == STEPS and got == ref, "losses-identical",
          "with sleeps %s, without %s" % (got, ref))
    print("INFO losses %s" % " ".join("%.6f" % float.fromhex(v) for v in got))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libvmmshim.so"))
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "torch-sleep"))
    ap.add_argument("--train")
    ap.add_argument("--wait-dir")
    ap.add_argument("--no-cache", action="store_true", help="PyTorch's caching allocator off in both runs")
    a = ap.parse_args()
    if a.train:
        train(a.train, a.wait_dir)
        return 0
    drive(a.lib, a.dir, a.no_cache)
    return summary("torch-sleep")


if __name__ == "__main__":
    sys.exit(main())
