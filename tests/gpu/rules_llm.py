"""Tag rules on an unmodified PyTorch generator: python3 tests/gpu/rules_llm.py --lib LIB

A tiny decoder (embedding, two attention + MLP layers, greedy decoding) whose weights are built on
the CPU and copied to the GPU before its first kernel, and whose KV cache grows by torch.cat in
tests/gpu/rules_kv.py, runs under the shim (LD_PRELOAD=LIB) with
    VMMSHIM_TAG_RULES='weights=phase:before-launch;kv=py:*rules_kv.py'
and PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a block of the shim's). The program is not
changed for the shim: it imports no vmmshim and sets no tag. The driver (this script) runs it
twice: once straight through (the reference tokens), once stopped half-way (it waits on a line of
its stdin) while the driver runs, from outside,
    vmmshim ctl PID sleep kv       -> device memory given back, at least the cache's bytes;
    vmmshim ctl PID status --json  -> kv asleep with nothing on the device, weights awake and there;
    vmmshim ctl PID wake kv
and then lets it finish: its tokens must equal the reference's. With PyTorch's caching allocator on,
the same is run and what is seen is printed as INFO lines (a segment holds the tag of the
allocation that made it, so the split is not exact there).

Prints "PASS name" / "FAIL name: why" per check, INFO lines, and "rules-llm: N passed, N failed";
exit 0, 1 when a check failed, 77 (with a "SKIP why" line) when PyTorch or its CUDA is not there.
Roles: without --gen, the driver; with --gen, the generator (one JSON line at the end)."""
import argparse
import json
import os
import subprocess
import sys
import time

from gpu_checks import check, failures, need_torch_cuda, summary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RULES = "weights=phase:before-launch;kv=py:*rules_kv.py"
TOKENS, PAUSE_AT = 48, 24
VOCAB, WIDTH, LAYERS, HEADS, PROMPT = 512, 256, 2, 4, 16


def generate(pause):
    import torch
    from rules_kv import KVCache

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
            self.out = torch.nn.Linear(WIDTH, WIDTH)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                                           torch.nn.Linear(4 * WIDTH, WIDTH))
            self.n1, self.n2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)

        def forward(self, x, cache, i):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split(WIDTH, dim=2)
            k, v = cache.append(i, k, v)
            heads = lambda z: z.view(b, z.shape[1], HEADS, WIDTH // HEADS).transpose(1, 2)  # noqa: E731
            a = torch.nn.functional.scaled_dot_product_attention(heads(q), heads(k), heads(v),
                                                                 is_causal=t > 1 and k.shape[1] == t)
            x = x + self.out(a.transpose(1, 2).reshape(b, t, WIDTH))
            return x + self.mlp(self.n2(x))

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, WIDTH)
            self.pos = torch.nn.Embedding(PROMPT + TOKENS, WIDTH)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
            self.head = torch.nn.Linear(WIDTH, VOCAB)

        def forward(self, ids, start, cache):
            x = self.emb(ids) + self.pos(torch.arange(start, start + ids.shape[1], device=ids.device))
            for i, layer in enumerate(self.layers):
                x = layer(x, cache, i)
            return self.head(x[:, -1])

    model = Decoder().eval()  # built on the CPU: no kernel yet
    prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    dev = torch.device("cuda")
    model = model.to(dev)  # copies only: the weights are allocated before the first launch
    ids = prompt.to(dev)
    cache, out, start = KVCache(LAYERS), [], 0
    with torch.no_grad():
        for n in range(TOKENS):
            logits = model(ids, start, cache)
            start += ids.shape[1]
            ids = logits.argmax(dim=-1, keepdim=True)
            out.append(int(ids.item()))
            if pause and n + 1 == PAUSE_AT:
                torch.cuda.synchronize()
                print("READY %d %d" % (os.getpid(), cache.nbytes()), flush=True)
                sys.stdin.readline()
    print(json.dumps({"tokens": out, "kv_bytes": cache.nbytes()}), flush=True)


def start(lib, cache_on, pause):
    env = dict(os.environ, LD_PRELOAD=lib, VMMSHIM_TAG_RULES=RULES, PYTHONPATH=HERE)
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    if not cache_on:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    args = [sys.executable, os.path.abspath(__file__), "--gen"] + (["--pause"] if pause else [])
    return subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def ctl(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "scripts", "python"))
    env.pop("LD_PRELOAD", None)
    return subprocess.run(["sh", os.path.join(ROOT, "scripts", "vmmshim"), "ctl"] + [str(a) for a in args],
                          capture_output=True, text=True, env=env, timeout=120)


def result(p, what):
    out, err = p.communicate(timeout=120)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    ok = p.returncode == 0 and lines
    return (json.loads(lines[-1]) if ok else None), "%s: exit %s: %s" % (what, p.returncode, err[-600:])


def tags_of(status):
    return {t["name"]: t for t in status.get("tags", [])}


def driven(lib, cache_on, ref, name):
    """The run stopped half-way and steered from outside; checks (or, cache on, INFO lines)."""
    strict = not cache_on
    say = (lambda ok, n, why: check(ok, "%s-%s" % (name, n), why)) if strict else \
        (lambda ok, n, why: print("INFO %s-%s: %s%s" % (name, n, "ok" if ok else "not as without the cache: ",
                                                         "" if ok else why)))
    p = start(lib, cache_on, True)
    try:
        line, t0 = "", time.monotonic()
        while not line.startswith("READY") and p.poll() is None and time.monotonic() - t0 < 60:
            line = p.stdout.readline()
        if not line.startswith("READY"):
            say(False, "ready", "the generator did not reach its pause (exit %s): %s" % (p.poll(), p.stderr.read()[-600:]))
            return
        pid, kv_bytes = int(line.split()[1]), int(line.split()[2])
        r = ctl(pid, "rules")
        print("INFO %s rules: %s" % (name, " | ".join(r.stdout.strip().splitlines()[1:])))
        r = ctl(pid, "status", "--json")
        before = tags_of(json.loads(r.stdout)) if r.returncode == 0 else {}
        print("INFO %s before the sleep: %s" % (name, ", ".join("%s live %d" % (k, v["live"]) for k, v in before.items())))
        say(before.get("kv", {}).get("live", 0) >= kv_bytes > 0 and before.get("weights", {}).get("live", 0) > 0,
            "tagged", "kv live %s (the cache holds %d bytes), weights live %s" % (
                before.get("kv", {}).get("live"), kv_bytes, before.get("weights", {}).get("live")))
        r = ctl(pid, "--json", "sleep", "kv")
        moved = json.loads(r.stdout) if r.returncode == 0 and r.stdout.startswith("{") else {}
        say(r.returncode == 0 and moved.get("released", 0) >= kv_bytes, "sleep",
            "vmmshim ctl %d sleep kv: exit %d, %s %s" % (pid, r.returncode, r.stdout.strip()[:300], r.stderr.strip()[:300]))
        r = ctl(pid, "status", "--json")
        st = tags_of(json.loads(r.stdout)) if r.returncode == 0 else {}
        kv, w = st.get("kv", {}), st.get("weights", {})
        say(kv.get("asleep") is True and kv.get("device", 1) == 0 and w.get("asleep") is False and w.get("device", 0) > 0,
            "status", "kv %s; weights %s" % (kv, w))
        print("INFO %s sleep kv: released %d bytes (cache %d bytes) in %.1f ms" % (
            name, moved.get("released", 0), kv_bytes, moved.get("ms") or 0.0))
        r = ctl(pid, "wake", "kv")
        say(r.returncode == 0, "wake", "vmmshim ctl %d wake kv: exit %d %s" % (pid, r.returncode, r.stderr.strip()[:300]))
        p.stdin.write("\n")
        p.stdin.flush()
        got, why = result(p, "the driven run")
        say(got is not None and got["tokens"] == ref, "tokens",
            "after the wake %s, without the sleep %s (%s)" % (got and got["tokens"], ref, why))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def drive(lib):
    need_torch_cuda(lib)
    if failures():
        return
    for cache_on in (False, True):
        name = "cache-on" if cache_on else "no-cache"
        p = start(lib, cache_on, False)
        ref, why = result(p, "the reference run")
        if not cache_on:
            check(ref is not None, "reference", why)
        if ref is None:
            print("INFO %s: %s" % (name, why))
            continue
        print("INFO %s reference tokens: %s" % (name, " ".join(map(str, ref["tokens"]))))
        driven(lib, cache_on, ref["tokens"], name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libvmmshim.so"))
    ap.add_argument("--gen", action="store_true")
    ap.add_argument("--pause", action="store_true")
    a = ap.parse_args()
    if a.gen:
        generate(a.pause)
        return 0
    drive(a.lib)
    return summary("rules-llm")


if __name__ == "__main__":
    sys.exit(main())
