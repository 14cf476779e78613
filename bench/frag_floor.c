/* frag_floor: the least memory that serves a workload with no driver call at all.
 *
 *   frag_floor <churn|varlen|FILE> [seed] [steps]
 *
 * An allocator that makes no VMM call after its warm-up maps a fixed amount of memory and
 * places every block inside it, never moving a live one. This program replays a workload
 * (bench/workloads.h, or a trace in bench/replay.cu's format) into one fixed arena, with the
 * shim's block sizes and alignments (policy.h), and finds by bisection the smallest arena in
 * which a placement policy serves every request: best fit (the smallest free range that fits)
 * and address-ordered first fit; also with the shim's two heaps (below and from 1 MiB), each
 * its own arena. Prints, per policy, that arena over the peak of live (requested) bytes: the
 * held / live at peak such an allocator cannot go below on that workload. No CUDA, no shim.
 *
 * Prints one line per policy:
 *   R floor work=<name> seed=<n> policy=<best|first|best-2heaps|first-2heaps> peak_live=<bytes> arena=<bytes> ratio=<x> */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/policy.h"
#include "workloads.h"

#define GRAN (64ull << 20) /* VMMSHIM_GRANULARITY's default */
#define MIN_GRAN (2ull << 20)

static size_t block_size(size_t req) { return vs_policy_block_size(req, GRAN, MIN_GRAN); }

typedef struct {
  size_t start, end;
} range_t;

typedef struct {
  range_t *free; /* address order, disjoint, never touching */
  size_t n, cap;
} arena_t;

static void arena_insert_at(arena_t *a, size_t i, range_t r) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 256;
    a->free = realloc(a->free, a->cap * sizeof *a->free);
    if (!a->free) abort();
  }
  memmove(&a->free[i + 1], &a->free[i], (a->n - i) * sizeof *a->free);
  a->free[i] = r;
  a->n++;
}

static void arena_remove_at(arena_t *a, size_t i) {
  memmove(&a->free[i], &a->free[i + 1], (a->n - i - 1) * sizeof *a->free);
  a->n--;
}

/* Places `size` bytes at `align`: returns the address, or SIZE_MAX when nothing fits. */
static size_t arena_alloc(arena_t *a, size_t size, size_t align, int best) {
  size_t pick = SIZE_MAX, pick_len = 0;
  for (size_t i = 0; i < a->n; i++) {
    size_t at = (a->free[i].start + align - 1) / align * align;
    if (at + size > a->free[i].end) continue;
    size_t len = a->free[i].end - a->free[i].start;
    if (pick == SIZE_MAX || len < pick_len) {
      pick = i;
      pick_len = len;
      if (!best) break;
    }
  }
  if (pick == SIZE_MAX) return SIZE_MAX;
  range_t r = a->free[pick];
  size_t at = (r.start + align - 1) / align * align;
  arena_remove_at(a, pick);
  size_t i = pick;
  if (at > r.start) arena_insert_at(a, i++, (range_t){r.start, at});
  if (at + size < r.end) arena_insert_at(a, i, (range_t){at + size, r.end});
  return at;
}

static void arena_free(arena_t *a, size_t at, size_t size) {
  size_t lo = 0, hi = a->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (a->free[mid].start < at) lo = mid + 1;
    else hi = mid;
  }
  range_t r = {at, at + size};
  if (lo > 0 && a->free[lo - 1].end == r.start) {
    r.start = a->free[--lo].start;
    arena_remove_at(a, lo);
  }
  if (lo < a->n && a->free[lo].start == r.end) {
    r.end = a->free[lo].end;
    arena_remove_at(a, lo);
  }
  arena_insert_at(a, lo, r);
}

/* Whether every request of the heap `heap` (-1: all) fits an arena of `bytes`. */
static int serves(const wl_event_t *ev, size_t n, size_t *addr, size_t bytes, int best, int heap) {
  arena_t a = {0};
  arena_insert_at(&a, 0, (range_t){0, bytes});
  int ok = 1;
  for (size_t i = 0; i < n && ok; i++) {
    size_t s = block_size(ev[i].size);
    if (heap >= 0 && vs_policy_heap_for(s) != heap) continue; /* the heap of the block, as the shim picks */
    if (ev[i].op == 'f') {
      arena_free(&a, addr[ev[i].id], s);
      continue;
    }
    addr[ev[i].id] = arena_alloc(&a, s, vs_policy_align(s), best);
    ok = addr[ev[i].id] != SIZE_MAX;
  }
  free(a.free);
  return ok;
}

/* The least arena that serves the heap's requests, by bisection over multiples of 256 bytes
 * (every block is one, at an alignment of 256 or more, so the least arena is one too; a larger
 * arena serves whatever a smaller one does, up to the placement's anomalies). SIZE_MAX: not
 * even three times the peak of live bytes. */
static size_t least_arena(const wl_event_t *ev, size_t n, size_t *addr, size_t live_peak, int best, int heap) {
  size_t lo = 0, hi = (live_peak * 3 + (64ull << 20)) / 256; /* in 256-byte units */
  if (serves(ev, n, addr, 0, best, heap)) return 0; /* no request in that heap */
  if (!serves(ev, n, addr, hi * 256, best, heap)) return SIZE_MAX;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (serves(ev, n, addr, mid * 256, best, heap)) hi = mid;
    else lo = mid;
  }
  return hi * 256;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: frag_floor <churn|varlen|FILE> [seed] [steps]\n");
    return 2;
  }
  uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
  unsigned steps = argc > 3 ? (unsigned)atoi(argv[3]) : 0;
  const char *work = argv[1];
  size_t n = 0;
  wl_event_t *ev;
  if (!strcmp(work, "churn")) {
    if (!steps) steps = 20000;
    ev = malloc((WL_CHURN_WINDOW + 2 * (size_t)steps) * sizeof *ev);
    n = wl_churn(seed, steps, ev);
  } else if (!strcmp(work, "varlen")) {
    if (!steps) steps = 200;
    ev = malloc((WL_VARLEN_PARAM_EVENTS + (size_t)steps * WL_VARLEN_STEP_EVENTS) * sizeof *ev);
    n = wl_varlen(seed, steps, ev);
  } else {
    ev = wl_read_trace(work, &n);
    const char *slash = strrchr(work, '/');
    work = slash ? slash + 1 : work;
  }
  if (!ev || !n) {
    fprintf(stderr, "frag_floor: no events in %s\n", argv[1]);
    return 1;
  }
  size_t max_id = 0;
  for (size_t i = 0; i < n; i++)
    if (ev[i].id > max_id) max_id = ev[i].id;
  /* Frees carry their object's size from here on; the peak of live requested bytes. */
  size_t *addr = calloc(max_id + 1, sizeof *addr);
  if (!addr) return 1;
  size_t live = 0, peak = 0;
  for (size_t i = 0; i < n; i++) {
    if (ev[i].op == 'a') {
      addr[ev[i].id] = ev[i].size;
      live += ev[i].size;
      if (live > peak) peak = live;
    } else {
      ev[i].size = addr[ev[i].id];
      live -= ev[i].size;
    }
  }
  static const char *names[] = {"first", "best"};
  int rc = 0;
  for (int best = 1; best >= 0; best--) {
    size_t small = least_arena(ev, n, addr, peak, best, 0), large = least_arena(ev, n, addr, peak, best, 1);
    size_t arena[2] = {least_arena(ev, n, addr, peak, best, -1),
                       small == SIZE_MAX || large == SIZE_MAX ? SIZE_MAX : small + large};
    for (int two = 0; two < 2; two++) {
      if (arena[two] == SIZE_MAX) {
        fprintf(stderr, "frag_floor: %s: policy %s%s needs more than 3 x the live peak\n", work, names[best],
                two ? "-2heaps" : "");
        rc = 1;
        continue;
      }
      printf("R floor work=%s seed=%llu policy=%s%s peak_live=%zu arena=%zu ratio=%.3f\n", work,
             (unsigned long long)seed, names[best], two ? "-2heaps" : "", peak, arena[two],
             (double)arena[two] / (double)peak);
    }
  }
  free(addr);
  free(ev);
  return rc;
}
