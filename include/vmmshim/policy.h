/* The pool's decisions, as pure functions of its figures: which heap serves a request, how
 * much a heap grows by, what idle memory a growth keeps, when a block is split and when a
 * whole block serves a request. The code that maps and unmaps (handles.c) and carves blocks
 * (pool_blocks.c) asks these; unit tests call them directly (tests/test_unit_policy.c).
 *
 * Why the heaps: requests live in three heaps by size (own reservations, bins and holes).
 * Small (< 1 MiB) and large (up to the granularity) blocks share handles; whole-heap blocks
 * (the granularity and more) are each exactly their own handle(s), never split for a smaller
 * request and never merged with a free neighbour, reused by a request of their size (down to
 * 1/16 smaller). So the physical memory of big blocks follows what is live, where a shared
 * handle stays mapped as long as any block in it lives, and growth still costs one handle
 * per request, as cudaMalloc does. Small blocks scattered between large ones would pin
 * partly used handles everywhere. */
#ifndef VMMSHIM_POLICY_H
#define VMMSHIM_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { VS_HEAP_SMALL = 0, VS_HEAP_LARGE = 1, VS_HEAP_WHOLE = 2, VS_NHEAPS = 3 };

#define VS_SMALL_MAX (1ull << 20) /* requests below this go to the small heap */
#define VS_WHOLE_SLACK 16         /* a whole block serves requests down to 1/16 smaller than it */
/* Shared heaps grow by 1/VS_GROW_FRACTION of what they map, from the minimum granularity up
 * to the pool's granularity: a small program maps little more than it uses, a growing one
 * reaches the granularity after a few handles. */
#define VS_GROW_FRACTION 8
/* Before growing, idle handles are given back (as many bytes as the growth maps), except:
 *   - up to mapped/VS_IDLE_BUDGET idle bytes stay, plus one handle of the granularity: a pool
 *     in its steady state that grows now and then would otherwise give back the handle it
 *     maps again a moment later;
 *   - whole blocks freed within the last VS_WHOLE_AGE allocations stay: a program that cycles
 *     through a few large sizes finds them again;
 *   - whole blocks whose last request was made, to the byte, at least twice among the last
 *     VS_WHOLE_RECENT whole-heap requests stay (a training loop asks for the same tensor
 *     sizes every step; a random mix of sizes hardly ever repeats one exactly), but only
 *     while idle memory stays under mapped/VS_RECUR_BUDGET.
 * Out of memory, VMMSHIM_LIMIT and vmmshim_trim give back everything idle. */
#define VS_IDLE_BUDGET 32
#define VS_WHOLE_AGE 8
#define VS_WHOLE_RECENT 32
#define VS_RECUR_BUDGET 8

/* The heap that serves a request of `size` bytes (already rounded to 256). */
static inline int vs_policy_heap_for(size_t size, size_t gran) {
  return size < VS_SMALL_MAX ? VS_HEAP_SMALL : size < gran ? VS_HEAP_LARGE : VS_HEAP_WHOLE;
}

/* Alignment of a block of `size` bytes: blocks of 4 MiB and more start on a 2 MiB boundary
 * (as cudaMalloc's large allocations do), the others on 256 bytes. */
static inline size_t vs_policy_align(size_t size) { return size >= (4ull << 20) ? (2ull << 20) : 256u; }

/* The handle size a heap grows by. Whole-heap requests (and the exact retry after out of
 * memory) get handles of exactly what they need (rounded to min_gran); the shared heaps
 * grow by 1/VS_GROW_FRACTION of what they map, between min_gran and gran. */
static inline size_t vs_policy_grow_handle(int heap_id, size_t heap_mapped, size_t gran, size_t min_gran,
                                           bool exact) {
  if (exact || heap_id == VS_HEAP_WHOLE) return min_gran;
  size_t step = (heap_mapped / VS_GROW_FRACTION + min_gran - 1) / min_gran * min_gran;
  if (step >= gran) return gran;
  return step > min_gran ? step : min_gran;
}

/* Idle bytes a growth of `want` bytes leaves mapped (first pass: recurring and young whole
 * blocks spared): what is idle beyond the growth goes, but never below the budget of
 * mapped/VS_IDLE_BUDGET plus one handle of the granularity. */
static inline size_t vs_policy_keep_idle(size_t idle, size_t want, size_t mapped, size_t gran) {
  size_t keep = idle > want ? idle - want : 0;
  size_t budget = mapped / VS_IDLE_BUDGET + gran;
  return keep < budget ? budget : keep;
}

/* The second pass: recurring sizes are kept only up to mapped/VS_RECUR_BUDGET idle, so a
 * program whose sizes vary over a wide set (a variable sequence length) does not hold them all. */
static inline size_t vs_policy_keep_recurring(size_t keep, size_t mapped) {
  size_t cap = mapped / VS_RECUR_BUDGET;
  return keep < cap ? cap : keep;
}

/* Whether a free block of `block` bytes serves a whole-heap request of `size` bytes (both
 * multiples of the minimum granularity): never split, so at most 1/16 of it is wasted. */
static inline bool vs_policy_whole_fits(size_t block, size_t size) {
  return block >= size && block <= size + size / (VS_WHOLE_SLACK - 1);
}

/* Whether carving `size` bytes out of `avail` leaves a remainder worth a block of its own. */
static inline bool vs_policy_should_split(size_t avail, size_t size) { return avail - size >= 256u; }

/* Deferred mode: a whole-heap request first waits for the deferred frees (the reclaimer's
 * synchronisation, made now: ~1 us on an idle GPU) when they hold half the pool or more and
 * enough for it: far cheaper than mapping a large handle, and a program that frees big
 * blocks faster than the reclaimer catches up does not grow without bound. */
static inline bool vs_policy_sync_before_growth(int heap_id, size_t size, size_t deferred, size_t mapped) {
  return heap_id == VS_HEAP_WHOLE && deferred >= size && deferred * 2 >= mapped;
}

#endif
