#!/usr/bin/env python3
"""Smoke test of bench/torch_serve.py on the CPU (--device cpu, a tiny model): it compiles; with
PyTorch, its "R serve" line has every field bench/report.py reads, two runs generate the same
tokens and another seed other ones, and the KV-cache decoding (left-padded prompts of different
lengths, the cache grown by torch.cat) generates what a full forward pass over each unpadded
prompt does. PyTorch is looked for in this Python, $TORCH_PYTHON, then python3 on PATH and
/usr/bin/python3 (Debian's python3-torch); without one only the compilation is checked.
Ends with "N passed, N failed"."""
import os
import re
import shutil
import subprocess
import sys

from harness import ROOT, check, summary

SERVE = os.path.join(ROOT, "bench", "torch_serve.py")
TINY = ["--device", "cpu", "--batches", "4", "--warmup", "1", "--batch", "3", "--min-prompt", "4", "--max-prompt",
        "12", "--new-tokens", "5", "--d-model", "64", "--layers", "2", "--heads", "4", "--vocab", "128"]

# Greedy decoding of left-padded prompts with the KV cache, against the model's own forward pass
# (bench/tfm.py, no cache, no padding) run again over each prompt and what it generated so far.
CHECK = r'''
import sys
sys.path.insert(0, sys.argv[1])
import tfm, torch_serve
torch = tfm.setup()
model, _ = tfm.build(torch, d_model=64, layers=2, heads=4, vocab=128, device="cpu")
model.eval()
rows = same = 0
worst = 0.0
padded = 0
with torch.inference_mode():
    for tok, pad in torch_serve.prompt_batches(torch, 128, 3, 4, 3, 11, 5):
        gen, logits = torch_serve.generate(torch, model, 4, tok, pad, 6)
        for r in range(tok.shape[0]):
            seq = tok[r:r + 1, pad[r]:]
            ref = []
            for _ in range(6):
                last = model(seq)[:, -1]
                ref.append(int(last.argmax(-1)))
                seq = torch.cat([seq, last.argmax(-1)[:, None]], dim=1)
            rows += 1
            padded += pad[r] > 0
            same += ref == gen[r].tolist()
            worst = max(worst, float((last[0] - logits[r]).abs().max()))
print("rows=%d same=%d padded=%d worst=%g" % (rows, same, padded, worst))
'''


def torch_python():
    seen = []
    for p in (sys.executable, os.environ.get("TORCH_PYTHON"), shutil.which("python3"), "/usr/bin/python3"):
        if not p or p in seen or not os.path.exists(p):
            continue
        seen.append(p)
        if subprocess.run([p, "-c", "import torch"], capture_output=True).returncode == 0:
            return p
    return None


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv)


def main():
    try:
        compile(open(SERVE).read(), SERVE, "exec")
        ok = True
    except SyntaxError as e:
        print(e)
        ok = False
    check(ok, "bench/torch_serve.py compiles")
    py = torch_python()
    if py is None:
        print("SKIP the CPU runs: no Python with PyTorch here (set TORCH_PYTHON); not counted")
        return summary()
    print("PyTorch from " + py)

    def run(*extra):
        r = subprocess.run([py, SERVE, "cpu-test"] + TINY + list(extra), capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
        lines = [x for x in r.stdout.splitlines() if x.startswith("R serve ")]
        return r, (fields(lines[-1]) if lines else {})

    r, a = run()
    check(r.returncode == 0 and a.get("cfg") == "cpu-test", "a CPU run prints its R serve line (%s)" % r.stderr[-300:])
    want = {"d_model", "layers", "vocab", "batches", "warmup", "batch", "new_tokens", "prompts", "tokens", "seconds",
            "tokens_per_s", "batch_ms_median", "peak_reserved", "peak_allocated", "used", "checksum", "logit_sum",
            "shim"}
    check(want <= set(a), "every field bench/report.py reads (missing %s)" % sorted(want - set(a)))
    check(a.get("tokens") == str(3 * 3 * 5) and a.get("prompts") == "4-12" and float(a.get("tokens_per_s", 0)) > 0
          and a.get("shim") == "0" and re.fullmatch(r"[0-9a-f]{16}", a.get("checksum", "")) is not None,
          "tokens: the timed batches' (3 x 3 x 5); a rate; a 16-digit checksum; no shim")
    r2, b = run()
    check(r2.returncode == 0 and (b.get("checksum"), b.get("logit_sum")) == (a.get("checksum"), a.get("logit_sum")),
          "a second run generates the same tokens and logits")
    r3, c = run("--seed", "12")
    check(r3.returncode == 0 and c.get("checksum") not in (None, a.get("checksum")),
          "another seed: other prompts, another checksum")
    r4 = subprocess.run([py, SERVE, "x", "--device", "cpu", "--max-prompt", "1000", "--new-tokens", "64"],
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
    check(r4.returncode == 2 and "exceeds the model's 1024 positions" in r4.stderr,
          "prompts longer than the model's positions: a usage error")

    r = subprocess.run([py, "-c", CHECK, os.path.join(ROOT, "bench")], capture_output=True, text=True, timeout=300)
    m = re.search(r"rows=(\d+) same=(\d+) padded=(\d+) worst=(\S+)", r.stdout)
    print(r.stdout.strip() or r.stderr[-500:])
    check(m is not None and m.group(1) == m.group(2) == "12" and int(m.group(3)) > 0 and float(m.group(4)) < 1e-4,
          "KV-cache decoding of padded prompts = the full forward pass over each prompt (tokens, last logits)")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
