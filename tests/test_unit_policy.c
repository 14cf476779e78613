/* test_unit_policy: the pool's decisions (include/vmmshim/policy.h) called directly with
 * chosen figures: which heap serves a size, block sizes and alignments, how much a heap grows
 * by, what idle memory a growth keeps, when a block is split, when a stream's freed block
 * serves its next request, when a stream's freed blocks are sealed, when a request waits for
 * deferred frees. Each boundary is checked on both sides. */
#include <stdio.h>

#include "vmmshim/policy.h"
#include "check.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

static void test_heap_for(void) {
  CHECK(vs_policy_heap_for(256) == VS_HEAP_SMALL, "256 B: small heap");
  CHECK(vs_policy_heap_for(MiB - 256) == VS_HEAP_SMALL, "just under 1 MiB: small heap");
  CHECK(vs_policy_heap_for(MiB) == VS_HEAP_LARGE, "1 MiB: large heap");
  CHECK(vs_policy_heap_for(3 * GiB) == VS_HEAP_LARGE, "3 GiB: large heap");
}

static void test_block_size(void) {
  size_t gran = 64 * MiB, min = 2 * MiB;
  CHECK(vs_policy_block_size(1, gran, min) == 256, "1 B: 256");
  CHECK(vs_policy_block_size(257, gran, min) == 512, "257 B: 512");
  CHECK(vs_policy_block_size(gran - 300, gran, min) == gran - 256, "under the granularity: 256-byte multiples");
  CHECK(vs_policy_block_size(gran + 1, gran, min) == gran + min, "over the granularity: minimum-granularity multiples");
  CHECK(vs_policy_block_size(gran, gran, min) == gran, "the granularity itself");
  CHECK(vs_policy_align(256) == 256, "256 B aligned to 256");
  CHECK(vs_policy_align(4 * MiB - 256) == 256, "just under 4 MiB aligned to 256");
  CHECK(vs_policy_align(4 * MiB) == 2 * MiB, "4 MiB aligned to 2 MiB");
}

static void test_grow_step(void) {
  size_t gran = 64 * MiB, min = 2 * MiB;
  CHECK(vs_policy_grow_step(0, gran, min, false) == min, "an empty heap grows by the minimum");
  CHECK(vs_policy_grow_step(64 * MiB, gran, min, false) == 8 * MiB, "64 MiB mapped: 1/8 = 8 MiB");
  CHECK(vs_policy_grow_step(17 * MiB, gran, min, false) == 4 * MiB,
        "17 MiB mapped: 1/8 rounded up to the minimum granularity = 4 MiB (got %zu)",
        vs_policy_grow_step(17 * MiB, gran, min, false));
  CHECK(vs_policy_grow_step(8 * GiB, gran, min, false) == gran, "8 GiB mapped: capped at the granularity");
  CHECK(vs_policy_grow_step(8 * GiB, gran, min, true) == min, "exact: the minimum");
}

static void test_keep_idle(void) {
  size_t gran = 64 * MiB;
  /* idle beyond the growth goes, but the budget mapped/32 + one granularity stays */
  CHECK(vs_policy_keep_idle(300 * MiB, 30 * MiB, 320 * MiB, gran) == 270 * MiB, "idle 300, growth 30: keep 270");
  CHECK(vs_policy_keep_idle(100 * MiB, 30 * MiB, 320 * MiB, gran) == 74 * MiB,
        "idle 100, growth 30, mapped 320: keep the budget 10 + 64 = 74 MiB");
  CHECK(vs_policy_keep_idle(10 * MiB, 30 * MiB, 320 * MiB, gran) == 74 * MiB, "idle under the growth: keep the budget");
}

static void test_should_split(void) {
  CHECK(vs_policy_should_split(4 * KiB, 4 * KiB - 256), "a 256-byte remainder is a block");
  CHECK(!vs_policy_should_split(4 * KiB, 4 * KiB), "nothing left: no split");
  CHECK(!vs_policy_should_split(4 * KiB + 255, 4 * KiB), "less than 256 left: no split");
}

static void test_stream_fits(void) {
  size_t size = 150 * MiB;
  CHECK(vs_policy_stream_fits(VS_HEAP_LARGE, size, size), "large: an exact fit");
  CHECK(vs_policy_stream_fits(VS_HEAP_LARGE, size + size / 15, size), "large: 1/16 of the block left over");
  CHECK(!vs_policy_stream_fits(VS_HEAP_LARGE, size + size / 15 + 2 * MiB, size), "large: more left over: the bins");
  CHECK(!vs_policy_stream_fits(VS_HEAP_LARGE, size - 256, size), "large: too small");
  CHECK(vs_policy_stream_fits(VS_HEAP_SMALL, 512 * KiB, 256), "small: any fit");
  CHECK(!vs_policy_stream_fits(VS_HEAP_SMALL, 256, 512), "small: too small");
}

static void test_seal(void) {
  size_t mapped = 64 * GiB;
  CHECK(!vs_policy_seal_stream(VS_SEAL_KEEP, 10 * GiB, mapped), "no more than the blocks kept: never");
  CHECK(vs_policy_seal_stream(VS_SEAL_KEEP + 1, mapped / VS_SEAL_FRACTION, mapped),
        "the older blocks hold 1/64 of the pool: seal");
  CHECK(!vs_policy_seal_stream(VS_SEAL_KEEP + 1, mapped / VS_SEAL_FRACTION - 1, mapped), "less: not yet");
  CHECK(vs_policy_seal_stream(VS_SEAL_COUNT, 0, mapped), "VS_SEAL_COUNT blocks: seal");
  CHECK(!vs_policy_seal_stream(VS_SEAL_COUNT - 1, 0, mapped), "fewer small ones: not yet");
}

static void test_sync_before_growth(void) {
  size_t gran = 64 * MiB;
  /* Nothing waits for the GPU: grow, whatever the figures. */
  CHECK(!vs_policy_sync_before_growth(GiB, gran, 0, true, 0, 4 * GiB), "nothing waiting: grow");
  /* A request of the granularity or more: waiting frees that hold half the pool and enough,
   * whether or not the GPU lags. */
  CHECK(vs_policy_sync_before_growth(GiB, gran, 2 * GiB, false, 2 * GiB, 4 * GiB), "waiting holds half the pool and enough");
  CHECK(!vs_policy_sync_before_growth(3 * GiB, gran, 2 * GiB, true, 5 * GiB, 4 * GiB),
        "not enough for the request, and growing stays within the bound: grow");
  /* The bound: what the pool would map, less one handle of the granularity, against 1.1 x what
   * it would have in use; only while the GPU lags. */
  CHECK(!vs_policy_sync_before_growth(gran, gran, gran, true, GiB, GiB + 2 * gran),
        "less than half, within the bound (1152 MiB + 64 for 1088 MiB): grow");
  CHECK(vs_policy_sync_before_growth(gran, gran, gran, true, GiB, GiB + 3 * gran),
        "less than half, past the bound (1280 MiB - 64 for 1088 MiB): wait");
  CHECK(!vs_policy_sync_before_growth(gran, gran, gran, false, GiB, GiB + 3 * gran),
        "past the bound, but the GPU keeps up: grow");
  CHECK(vs_policy_sync_before_growth(8 * MiB, gran, 100 * MiB, true, 800 * MiB, GiB),
        "1032 MiB - 64 for 808 MiB in use (1.20): wait");
  CHECK(vs_policy_sync_before_growth(8 * MiB, gran, 2 * MiB, true, 800 * MiB, GiB),
        "past the bound, with less waiting than the request: wait all the same");
  CHECK(!vs_policy_sync_before_growth(8 * MiB, gran, 100 * MiB, true, 900 * MiB, GiB),
        "1032 MiB - 64 for 908 MiB in use (1.07): grow");
  CHECK(!vs_policy_sync_before_growth(16 * MiB, gran, 16 * MiB, true, 0, 48 * MiB),
        "a pool smaller than one handle of the granularity: grow");
  CHECK(!vs_policy_sync_before_growth(gran - 256, gran, 2 * GiB, true, 4 * GiB, 4 * GiB + gran),
        "below the granularity, within the bound: grow");
  /* The bound itself: 11 to 10, at the edge. */
  CHECK(!vs_policy_sync_before_growth(0, gran, GiB, true, 10 * GiB, 11 * GiB + gran), "exactly 1.1: grow");
  CHECK(vs_policy_sync_before_growth(0, gran, GiB, true, 10 * GiB, 11 * GiB + gran + 64 * MiB), "past 1.1: wait");
}

int main(void) {
  test_heap_for();
  test_block_size();
  test_grow_step();
  test_keep_idle();
  test_should_split();
  test_stream_fits();
  test_seal();
  test_sync_before_growth();
  return check_summary();
}
