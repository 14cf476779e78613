#!/usr/bin/env python3
"""Real-program benchmark: training steps of bench/tfm.py's transformer (d_model 512, 4 layers,
batch 32, sequence 128), under whatever allocator the environment selects.

    python3 bench/torch_step.py <label> [--steps 30] [--warmup 5]

bench/run.sh runs it as (a) the caching allocator, (b) PYTORCH_NO_CUDA_MEMORY_CACHING=1,
(c) the same under the shim, (d) the shim in deferred free mode. Prints
    R step cfg=<label> steps=.. median_ms=.. p90_ms=.. loss=<final loss, repr> torch_reserved=..
      torch_allocated=.. used_fwd=.. shim=...
used_fwd: device memory in use at the end of a forward pass (cudaMemGetInfo, minus the use before
the model was built), sampled in the warm-up steps: the only figure available in case (b).
The final loss of (b), (c) and (d) must be equal: bench/report.py compares them."""
import argparse
import os
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests", "gpu"))
import tfm  # noqa: E402
import vsstats  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch = tfm.setup()
    vocab = 8192
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info()
    model, opt = tfm.build(torch, vocab=vocab)
    data = list(tfm.batches(torch, vocab, a.batch, [a.seq] * (a.warmup + a.steps)))
    used_fwd = 0
    for i in range(a.warmup):
        tok = data[i]
        logits = model(tok[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tok[:, 1:].reshape(-1))
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
        used_fwd = max(used_fwd, free0 - free)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    times = []
    loss = None
    for i in range(a.warmup, a.warmup + a.steps):
        loss, ms = tfm.timed(torch, lambda: tfm.train_step(torch, model, opt, data[i], vocab))
        times.append(ms)
    times.sort()
    st = vsstats.get_stats()
    line = "R step cfg=%s steps=%d median_ms=%.3f p90_ms=%.3f loss=%r torch_reserved=%d torch_allocated=%d used_fwd=%d" % (
        a.label, a.steps, statistics.median(times), times[int(len(times) * 0.9)], float(loss.item()),
        torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated(), used_fwd)
    if st is None:
        line += " shim=0"
    else:
        line += (" shim=1 shim_allocs=%d shim_peak_mapped=%d shim_peak_in_use=%d shim_syncs=%d shim_vmm_calls=%d"
                 " shim_vmm_ms=%.3f shim_pools=%d" % (
                     st["allocs_total"], st["peak_bytes_mapped"], st["peak_bytes_in_use"], st["syncs"],
                     st["vmm_calls"], st["vmm_ns"] / 1e6, st["pools"]))
    print(line, flush=True)


if __name__ == "__main__":
    main()
