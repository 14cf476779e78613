/* The pool's decisions, as pure functions of its figures: which heap serves a request, how a
 * request is rounded and aligned, how much a heap grows by, what idle memory a growth keeps,
 * when a block is split, when a stream's freed block serves its next request, when a stream's
 * freed blocks are sealed, when a request waits for deferred frees. The code that maps and
 * unmaps (handles.c), carves blocks (pool_blocks.c) and reclaims them (reclaim.c) asks these;
 * unit tests call them directly (tests/test_unit_policy.c).
 *
 * Why two heaps, and why blocks of every size split and merge (measured on the host
 * emulation, whose VMM call counts match the GPU's, with `make bench-cpu`: README "The pool"):
 * the small heap (< 1 MiB) keeps tiny blocks from pinning the handles of large ones. In the
 * large heap (1 MiB and more) a free block serves any smaller request (the rest stays free)
 * and free neighbours merge, whatever their size: an earlier design gave requests of the
 * granularity and more handles of their own, reused only by about the same size, and a
 * program whose large sizes vary gave back and created handles all the time (28 VMM calls per
 * 100 allocations on a random churn, 124 on a transformer with variable sequence lengths);
 * splitting makes that 0.1-1. Growth still maps a request of the granularity or more with one
 * handle of its own size, so first-time growth costs what cudaMalloc costs. */
#ifndef VMMSHIM_POLICY_H
#define VMMSHIM_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { VS_HEAP_SMALL = 0, VS_HEAP_LARGE = 1, VS_NHEAPS = 2 };

#define VS_SMALL_MAX (1ull << 20) /* requests below this go to the small heap */
/* A stream's freed block serves that stream's next request only when at most 1/16 of it
 * would be left over: a larger one goes to the bins, where it merges with its neighbours
 * (splitting it on the stream's list would leave pieces that cannot merge until sealed). */
#define VS_STREAM_SLACK 16
/* Heaps grow by 1/VS_GROW_FRACTION of what they map, from the minimum granularity up to the
 * pool's granularity (a request that needs more gets exactly what it needs): a small program
 * maps little more than it uses, a growing one reaches the granularity after a few handles. */
#define VS_GROW_FRACTION 8
/* Before growing, idle handles are given back (as many bytes as the growth maps), except up
 * to mapped/VS_IDLE_BUDGET idle bytes plus one handle of the granularity: a pool in its
 * steady state that grows now and then would otherwise give back the handle it maps again a
 * moment later. Out of memory, VMMSHIM_LIMIT and vmmshim_trim give back everything idle. */
#define VS_IDLE_BUDGET 32
/* The stitch (space.c, VMMSHIM_STITCH): a growth first maps idle whole handles of the pool side
 * by side into its new range, at most VS_STITCH_PIECES of them, each no larger than the growth
 * still needs (a request small enough for a free handle never grows). Each costs a cuMemUnmap where it was and a cuMemMap plus its share of one
 * cuMemSetAccess where it goes, against a cuMemCreate (and, later, the cuMemRelease of the idle
 * handle) for a new one: about even per handle, so the count is bounded, not the bytes
 * (docs/design.md, "Stitching"). */
#define VS_STITCH_PIECES 8
/* A stream's freed blocks, all but its VS_SEAL_KEEP newest (which its next requests look at
 * first: a program that frees and allocates the same size on a stream reuses them at once),
 * are sealed (an event recorded after them; once it has completed they join the bins and
 * merge) when the stream holds VS_SEAL_COUNT blocks, or when the older ones hold
 * 1/VS_SEAL_FRACTION of what the pool maps: prompt merging keeps large memory contiguous, and
 * a seal costs an event record and a query, amortised over many frees. */
#define VS_SEAL_KEEP 4
#define VS_SEAL_COUNT 32
#define VS_SEAL_FRACTION 64

/* The heap that serves a request of `size` bytes. */
static inline int vs_policy_heap_for(size_t size) { return size < VS_SMALL_MAX ? VS_HEAP_SMALL : VS_HEAP_LARGE; }

/* A request's block size: 256-byte multiples; requests of the granularity and more in
 * multiples of the minimum granularity, so that large blocks end on handle boundaries. */
static inline size_t vs_policy_block_size(size_t req, size_t gran, size_t min_gran) {
  size_t size = (req + 255) / 256 * 256;
  if (size >= gran) size = (size + min_gran - 1) / min_gran * min_gran;
  return size;
}

/* Alignment of a block of `size` bytes: blocks of 4 MiB and more start on a 2 MiB boundary
 * (as cudaMalloc's large allocations do), the others on 256 bytes. */
static inline size_t vs_policy_align(size_t size) { return size >= (4ull << 20) ? (2ull << 20) : 256u; }

/* The least a heap grows by: 1/VS_GROW_FRACTION of what it maps, between min_gran and gran;
 * exact (the out-of-memory retry): min_gran, only what is missing. A request that needs more
 * than this gets exactly what it needs (handles.c), so a request of the granularity or more
 * grows the heap by one handle of its own size. */
static inline size_t vs_policy_grow_step(size_t heap_mapped, size_t gran, size_t min_gran, bool exact) {
  if (exact) return min_gran;
  size_t step = (heap_mapped / VS_GROW_FRACTION + min_gran - 1) / min_gran * min_gran;
  if (step >= gran) return gran;
  return step > min_gran ? step : min_gran;
}

/* Idle bytes a growth of `want` bytes leaves mapped: what is idle beyond the growth goes, but
 * never below the budget of mapped/VS_IDLE_BUDGET plus one handle of the granularity. */
static inline size_t vs_policy_keep_idle(size_t idle, size_t want, size_t mapped, size_t gran) {
  size_t keep = idle > want ? idle - want : 0;
  size_t budget = mapped / VS_IDLE_BUDGET + gran;
  return keep < budget ? budget : keep;
}

/* Whether carving `size` bytes out of `avail` leaves a remainder worth a block of its own. */
static inline bool vs_policy_should_split(size_t avail, size_t size) { return avail - size >= 256u; }

/* Whether a block freed on a stream, with `avail` usable bytes, serves that stream's request
 * of `size` bytes at once: any fit in the small heap; in the large heap at most 1/16 left over. */
static inline bool vs_policy_stream_fits(int heap_id, size_t avail, size_t size) {
  return avail >= size && (heap_id == VS_HEAP_SMALL || avail - size <= avail / VS_STREAM_SLACK);
}

/* Whether a stream's freed blocks are sealed now: `count` of them, `older_bytes` in all but
 * the VS_SEAL_KEEP newest. */
static inline bool vs_policy_seal_stream(unsigned count, size_t older_bytes, size_t mapped) {
  return count > VS_SEAL_KEEP && (count >= VS_SEAL_COUNT || older_bytes >= mapped / VS_SEAL_FRACTION);
}

/* Before growing, a request waits for freed memory that waits for the GPU (deferred frees, for a
 * synchronous request: a context sync, as the reclaimer makes; its own stream's frees, for a
 * stream request: a sync of that stream) when either
 *   - it is of the granularity or more, and that memory holds half the pool and enough for it:
 *     far cheaper than mapping a large handle, and a program that frees big blocks faster than
 *     the GPU catches up does not grow without bound; or
 *   - growing would take what the pool maps past VS_HELD_BOUND_NUM/VS_HELD_BOUND_DEN of what it
 *     would have in use, plus one handle of the granularity, while the GPU lags (`lagging`: the
 *     last context sync, or the one in flight, took VS_LAG_NS or more; always, for a stream's
 *     frees): once the GPU catches up that memory is idle, and mapping more now would hold
 *     memory nobody uses (once free, it serves the request, or is given back before the
 *     growth). While the GPU keeps up the pool grows instead: a program that frees and
 *     allocates again in a tight loop would otherwise synchronise at every allocation that
 *     comes before the reclaimer, several times slower per pair.
 * A sync costs little on an idle GPU and the queued work's time on a busy one; a growth costs
 * far more. The rule lowers what a program holds at its peak while the GPU lags; a tighter bound
 * does not lower it further: what is left is memory the GPU has not caught up with, not the
 * bound. The figures are in docs/rationale.md ("Waiting for the GPU before growing") and
 * docs/design.md. */
#define VS_HELD_BOUND_NUM 11
#define VS_HELD_BOUND_DEN 10
#define VS_LAG_NS 100000ull
static inline bool vs_policy_sync_before_growth(size_t size, size_t gran, size_t waiting, bool lagging, size_t used,
                                                size_t mapped) {
  if (!waiting) return false;
  if (size >= gran && waiting >= size && waiting * 2 >= mapped) return true;
  size_t in_use = used + size;
  size_t after = mapped + size; /* what the pool would map, at the least */
  return lagging && after > gran && (after - gran) / VS_HELD_BOUND_NUM > in_use / VS_HELD_BOUND_DEN;
}

#endif
