#!/usr/bin/env python3
"""Fragmentation under PyTorch: training steps of bench/tfm.py's transformer with a sequence
length that changes every step (32..512, seeded), so tensors of ever new sizes come and go.

    python3 bench/torch_frag.py <label> [--steps 40]

bench/run.sh runs it with the caching allocator, with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
and under the shim with PYTORCH_NO_CUDA_MEMORY_CACHING=1. Prints
    R tfrag cfg=<label> steps=.. torch_reserved=.. torch_allocated=.. loss=.. shim=...
The ratio that matters: torch_reserved/torch_allocated (caching allocator) against
shim_peak_mapped/shim_peak_in_use (shim)."""
import argparse
import os
import random
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests", "gpu"))
import tfm  # noqa: E402
import vsstats  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    torch = tfm.setup()
    vocab = 8192
    rng = random.Random(7)
    lens = [rng.choice(range(32, 513, 8)) for _ in range(a.steps)]
    model, opt = tfm.build(torch, vocab=vocab)
    t0 = time.perf_counter()
    loss = None
    for tok in tfm.batches(torch, vocab, a.batch, lens):
        loss = tfm.train_step(torch, model, opt, tok, vocab)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    st = vsstats.get_stats()
    line = "R tfrag cfg=%s steps=%d seconds=%.2f loss=%r torch_reserved=%d torch_allocated=%d" % (
        a.label, a.steps, secs, float(loss.item()), torch.cuda.max_memory_reserved(),
        torch.cuda.max_memory_allocated())
    if st is None:
        line += " shim=0"
    else:
        line += " shim=1 shim_allocs=%d shim_peak_mapped=%d shim_peak_in_use=%d" % (
            st["allocs_total"], st["peak_bytes_mapped"], st["peak_bytes_in_use"])
    print(line, flush=True)


if __name__ == "__main__":
    main()
