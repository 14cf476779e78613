#!/usr/bin/env python3
"""Writes a seeded synthetic allocation trace for bench/replay.cu.

    python3 bench/gen_trace.py [-o bench/traces/synthetic.csv] [--seed 1] [--events 20000]

Format (one event a line, '#' lines are comments):
    a <id> <size>     allocate <size> bytes as object <id> (ids count up from 0)
    f <id>            free object <id>
Every object is freed by the end. The same seed always gives the same file.

Model: one allocation per step; sizes from a mix of log-uniform classes (small 256 B-64 KiB,
medium 64 KiB-16 MiB, large 16-512 MiB) and lifetimes from a mix of short, medium and long
(in steps); every 500 steps a burst of short-lived large buffers (a model's activations). Live
bytes are kept under a cap (allocations that would pass it are dropped), so that the peak of
live bytes lands at 8-16 GiB. Small long-lived objects left between large short-lived ones are
what fragments an allocator's memory."""
import argparse
import heapq
import math
import os
import random

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def log_uniform(rng, lo, hi):
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def size_sample(rng):
    u = rng.random()
    if u < 0.55:
        s = log_uniform(rng, 256, 64 * KiB)
    elif u < 0.90:
        s = log_uniform(rng, 64 * KiB, 16 * MiB)
    else:
        s = log_uniform(rng, 16 * MiB, 512 * MiB)
    if rng.random() < 0.5:  # half of them rounded like framework tensors are
        s = (s + 511) // 512 * 512
    return max(256, min(s, 512 * MiB))


def lifetime_sample(rng):
    u = rng.random()
    if u < 0.60:
        return 1 + int(rng.expovariate(1 / 10))
    if u < 0.90:
        return 1 + int(rng.expovariate(1 / 300))
    return rng.randint(2000, 12000)


def generate(seed, target_events, cap):
    rng = random.Random(seed)
    events = []
    heap = []  # (death step, id)
    live = {}
    live_bytes = peak = 0
    next_id = 0
    step = 0
    # Stop allocating when the allocations made plus the frees still owed reach the target.
    while len(events) + len(live) < target_events:
        while heap and heap[0][0] <= step:
            _, oid = heapq.heappop(heap)
            events.append("f %d" % oid)
            live_bytes -= live.pop(oid)
        burst = step % 500 == 0 and step > 0
        for _ in range(12 if burst else 1):
            if burst:
                size, life = log_uniform(rng, 64 * MiB, 512 * MiB), 1 + int(rng.expovariate(1 / 15))
            else:
                size, life = size_sample(rng), lifetime_sample(rng)
            if live_bytes + size > cap:
                continue
            events.append("a %d %d" % (next_id, size))
            live[next_id] = size
            live_bytes += size
            peak = max(peak, live_bytes)
            heapq.heappush(heap, (step + life, next_id))
            next_id += 1
        step += 1
    # Free what is left, in death order.
    while heap:
        _, oid = heapq.heappop(heap)
        events.append("f %d" % oid)
        live_bytes -= live.pop(oid)
    return events, next_id, peak, step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("-o", "--output", default=os.path.join(here, "traces", "synthetic.csv"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--cap-gib", type=float, default=14.0, help="live bytes never exceed this")
    a = ap.parse_args()
    events, objects, peak, steps = generate(a.seed, a.events, int(a.cap_gib * GiB))
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    with open(a.output, "w") as f:
        f.write("# vmmshim synthetic allocation trace: bench/gen_trace.py --seed %d --events %d --cap-gib %g\n"
                % (a.seed, a.events, a.cap_gib))
        f.write("# events %d objects %d steps %d peak_live_bytes %d\n" % (len(events), objects, steps, peak))
        f.write("# a <id> <size> | f <id>\n")
        f.write("\n".join(events))
        f.write("\n")
    print("%s: %d events, %d objects, peak live %.2f GiB" % (a.output, len(events), objects, peak / GiB))


if __name__ == "__main__":
    main()
