#!/usr/bin/env python3
"""The cost of a py: tag rule (docs/tag-rules.md): cudaMallocAsync + cudaFreeAsync pairs made from
Python through ctypes (the GIL released around each call, as PyTorch releases it around its
operators), under the shim, with or without VMMSHIM_TAG_RULES set by the caller. The same
program runs on the host emulation (`make bench-cpu`) and on a GPU (`make bench`, step pairs).

    rules_py.py LABEL [SIZE]

For SIZE (4096): 5,000 warm-up pairs, then 15 rounds of 5,000 pairs, each timed whole; prints
    R pairs cfg=LABEL size=SIZE threads=1 pairs=N median_us=.. p99_us=.. pairs_per_s=..
(the pair rows' format: p99_us is the slowest round's pair). Each pair's Python frame is this
file's pairs(): a rule py:*/rules_py.py matches it, py:*/nothing.py does not."""
import ctypes
import ctypes.util
import glob
import os
import sys
import time

ROUNDS, PAIRS = 15, 5000


def runtime():
    """The CUDA runtime the process loads (the shim's hooks are found through it with RTLD_GLOBAL)."""
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    names += sorted(glob.glob(os.path.join(cuda, "lib64", "libcudart.so*")))
    for base in sys.path:  # pip's nvidia wheels (PyTorch's): nvidia/cuda_runtime/lib, nvidia/cu13/lib
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcudart.so*")))
    for n in names:
        try:
            ctypes.CDLL(n, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(None)
        except OSError:
            continue
    sys.exit("rules_py: no CUDA runtime (libcudart.so) could be loaded")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: rules_py.py LABEL [SIZE]")
    label, size = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    rt = runtime()
    stream = ctypes.c_void_p()
    if rt.cudaStreamCreate(ctypes.byref(stream)) != 0:
        sys.exit("rules_py: cudaStreamCreate failed")
    malloc, free = rt.cudaMallocAsync, rt.cudaFreeAsync
    p = ctypes.c_void_p()
    ref, n, s = ctypes.byref(p), ctypes.c_size_t(size), stream

    def pairs(count):
        for _ in range(count):
            if malloc(ref, n, s) != 0 or free(p, s) != 0:
                sys.exit("rules_py: a pair of %d bytes failed" % size)

    pairs(PAIRS)
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter_ns()
        pairs(PAIRS)
        times.append((time.perf_counter_ns() - t0) / PAIRS)
    rt.cudaStreamSynchronize(stream)
    times.sort()
    med = times[len(times) // 2]
    print("R pairs cfg=%s size=%d threads=1 pairs=%d median_us=%.3f p99_us=%.3f pairs_per_s=%.1f"
          % (label, size, ROUNDS * PAIRS, med / 1000.0, times[-1] / 1000.0, 1e9 / med), flush=True)


if __name__ == "__main__":
    main()
