#!/usr/bin/env python3
"""LLM-serving shape under PyTorch: bench/tfm.py's decoder generating greedily for batches of
prompts of random lengths (seeded), with a KV cache that grows by torch.cat at every token. Each
token of each layer allocates a key and a value tensor one position longer than the last and
frees the old ones, at sizes that change with every batch: the pattern that fragments a caching
allocator.

    python3 bench/torch_serve.py <label> [--batches 32] [--batch 8] [--min-prompt 32]
        [--max-prompt 512] [--new-tokens 64] [--d-model 512] [--layers 4] [--heads 8]
        [--vocab 8192] [--warmup 2] [--seed 11] [--device cuda]

bench/run.sh runs it with the caching allocator, expandable segments and the cudaMallocAsync
backend, each without and with the shim, and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the
shim in sync and deferred mode. Prints
    R serve cfg=<label> d_model=.. layers=.. vocab=.. batches=.. warmup=.. batch=.. new_tokens=..
      prompts=MIN-MAX tokens=.. seconds=.. tokens_per_s=.. batch_ms_median=.. peak_reserved=..
      peak_allocated=.. used=.. checksum=.. logit_sum=.. shim=0|1 [shim_...]
tokens_per_s: generated tokens over the time of the batches after the warm-up (prefill included).
peak_reserved / peak_allocated: PyTorch's peaks (the cudaMallocAsync backend reports its pool's).
used: device memory in use at the last token of a batch (cudaMemGetInfo, minus the use before
the model was built), the highest over the batches. checksum: a hash of every generated token,
logit_sum: the sum of every batch's last logits: equal in every run on the same GPU whatever the
allocator (bench/report.py compares them with the caching allocator's).
--device cpu runs the same on the host (a smoke test of the script: tests/scripts)."""
import argparse
import hashlib
import os
import random
import statistics
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests", "gpu"))
import tfm  # noqa: E402
import vsstats  # noqa: E402


def prompt_batches(torch, vocab, batches, batch, lo, hi, seed):
    """[(tokens, pad)]: tokens (batch, longest) on the host, each prompt left-padded to the
    longest of its batch; pad[i]: how many of row i's first tokens are padding."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        lens = [rng.randint(lo, hi) for _ in range(batch)]
        longest = max(lens)
        out.append((torch.randint(0, vocab, (batch, longest), generator=g), [longest - n for n in lens]))
    return out


def layer(torch, blk, heads, x, mask, cache):
    """One block of tfm.build's model over the new positions x (b, t, d), attending to the cached
    keys and values and these; returns x and the grown cache (keys, values: b, heads, T, d/heads)."""
    b, t, d = x.shape
    hd = d // heads
    q, k, v = blk.qkv(blk.ln1(x)).view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
    if cache is None:
        k, v = k.contiguous(), v.contiguous()
    else:
        k = torch.cat([cache[0], k], dim=2)
        v = torch.cat([cache[1], v], dim=2)
    att = (q @ k.transpose(-1, -2)) * (hd ** -0.5)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, d)
    x = x + blk.proj(y)
    x = x + blk.fc2(torch.nn.functional.gelu(blk.fc1(blk.ln2(x))))
    return x, (k, v)


def forward(torch, model, heads, x, mask, caches):
    """The model over new positions; returns the last position's logits (b, vocab)."""
    for i, blk in enumerate(model.blocks):
        x, caches[i] = layer(torch, blk, heads, x, mask, caches[i])
    return model.head(model.ln(x[:, -1]))


def generate(torch, model, heads, tok, pad, new_tokens, on_last=None):
    """Greedy decoding of new_tokens for the left-padded prompts tok (b, T) on the model's device:
    a prefill of the prompts, then one position at a time with the KV cache grown by torch.cat.
    Returns (generated tokens (b, new_tokens), the last logits). on_last() runs at the last token,
    while the cache is at its longest."""
    dev = tok.device
    b, t = tok.shape
    pad_t = torch.tensor(pad, device=dev)
    key_valid = torch.arange(t, device=dev)[None, :] >= pad_t[:, None]
    pos = (torch.arange(t, device=dev)[None, :] - pad_t[:, None]).clamp(min=0)
    causal = torch.ones(t, t, device=dev, dtype=torch.bool).triu(1)
    # A prompt's token never sees padding; a padding row sees what causality allows, so that
    # no row is all -inf (its NaN would reach the real rows through the cached values).
    mask = causal[None, None] | (~key_valid[:, None, None, :] & key_valid[:, None, :, None])
    caches = [None] * len(model.blocks)
    logits = forward(torch, model, heads, model.emb(tok) + model.pos[pos], mask, caches)
    nxt = logits.argmax(-1)
    out = [nxt]
    cur = (t - pad_t)[:, None]
    for i in range(1, new_tokens):
        key_valid = torch.cat([key_valid, torch.ones(b, 1, device=dev, dtype=torch.bool)], dim=1)
        x = model.emb(nxt[:, None]) + model.pos[cur + (i - 1)]
        logits = forward(torch, model, heads, x, ~key_valid[:, None, None, :], caches)
        nxt = logits.argmax(-1)
        out.append(nxt)
        if i == new_tokens - 1 and on_last is not None:
            on_last()
    return torch.stack(out, dim=1), logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--batches", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=2, help="batches not timed (they count in the checksum)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if not (1 <= a.min_prompt <= a.max_prompt and a.new_tokens >= 1 and a.batches > a.warmup >= 0 and a.batch >= 1):
        ap.error("need 1 <= --min-prompt <= --max-prompt, --new-tokens >= 1, --batches > --warmup >= 0")
    if a.d_model % a.heads:
        ap.error("--d-model must be a multiple of --heads")
    torch = tfm.setup()
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.zeros(1, device=a.device)
        torch.cuda.synchronize()
        free0, _ = torch.cuda.mem_get_info()
    model, _ = tfm.build(torch, d_model=a.d_model, layers=a.layers, heads=a.heads, vocab=a.vocab, device=a.device)
    if a.max_prompt + a.new_tokens > model.pos.shape[0]:
        ap.error("--max-prompt + --new-tokens exceeds the model's %d positions" % model.pos.shape[0])
    model.eval()
    data = prompt_batches(torch, a.vocab, a.batches, a.batch, a.min_prompt, a.max_prompt, a.seed)
    used = [0]

    def sample_use():
        if cuda:
            free, _ = torch.cuda.mem_get_info()
            used[0] = max(used[0], free0 - free)

    digest = hashlib.sha256()
    logit_sum = 0.0
    batch_ms = []
    with torch.inference_mode():
        t0 = None
        for i, (tok, pad) in enumerate(data):
            if i == a.warmup:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            tb = time.perf_counter()
            gen, logits = generate(torch, model, a.heads, tok.to(a.device), pad, a.new_tokens, sample_use)
            # The answer goes back to the host as a server returns it (one wait per batch).
            digest.update(repr(gen.cpu().tolist()).encode())
            logit_sum += float(logits.double().sum().item())
            batch_ms.append((time.perf_counter() - tb) * 1e3)
        if cuda:
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
    timed = a.batches - a.warmup
    tokens = timed * a.batch * a.new_tokens
    if cuda:
        try:
            reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
        except (RuntimeError, NotImplementedError):  # a backend without these statistics
            reserved = allocated = 0
    else:
        reserved = allocated = 0
    st = vsstats.get_stats()
    line = ("R serve cfg=%s d_model=%d layers=%d vocab=%d batches=%d warmup=%d batch=%d new_tokens=%d prompts=%d-%d"
            " tokens=%d seconds=%.3f tokens_per_s=%.1f batch_ms_median=%.2f peak_reserved=%d peak_allocated=%d used=%d"
            " checksum=%s logit_sum=%r" % (
                a.label, a.d_model, a.layers, a.vocab, a.batches, a.warmup, a.batch, a.new_tokens, a.min_prompt,
                a.max_prompt, tokens, secs, tokens / secs, statistics.median(batch_ms[a.warmup:]), reserved, allocated,
                used[0], digest.hexdigest()[:16], logit_sum))
    if st is None:
        line += " shim=0"
    else:
        line += (" shim=1 shim_allocs=%d shim_peak_mapped=%d shim_peak_in_use=%d shim_syncs=%d shim_vmm_calls=%d"
                 " shim_pools=%d" % (st["allocs_total"], st["peak_bytes_mapped"], st["peak_bytes_in_use"], st["syncs"],
                                     st["vmm_calls"], st["pools"]))
    print(line, flush=True)


if __name__ == "__main__":
    main()
