/* test_unit_policy: the pool's decisions (include/vmmshim/policy.h) called directly with
 * chosen figures: which heap serves a size, alignments, how much a heap grows by, what idle
 * memory a growth keeps, when a whole block serves a request, when a block is split, when a
 * whole-heap request waits for deferred frees. Each boundary is checked on both sides. */
#include <stdio.h>

#include "vmmshim/policy.h"
#include "check.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

static void test_heap_for(void) {
  size_t gran = 64 * MiB;
  CHECK(vs_policy_heap_for(256, gran) == VS_HEAP_SMALL, "256 B: small heap");
  CHECK(vs_policy_heap_for(MiB - 256, gran) == VS_HEAP_SMALL, "just under 1 MiB: small heap");
  CHECK(vs_policy_heap_for(MiB, gran) == VS_HEAP_LARGE, "1 MiB: large heap");
  CHECK(vs_policy_heap_for(gran - 256, gran) == VS_HEAP_LARGE, "just under the granularity: large heap");
  CHECK(vs_policy_heap_for(gran, gran) == VS_HEAP_WHOLE, "the granularity: whole heap");
  CHECK(vs_policy_heap_for(3 * GiB, gran) == VS_HEAP_WHOLE, "3 GiB: whole heap");
  CHECK(vs_policy_heap_for(2 * MiB, 2 * MiB) == VS_HEAP_WHOLE, "granularity 2 MiB: 2 MiB is whole");
}

static void test_align(void) {
  CHECK(vs_policy_align(256) == 256, "256 B aligned to 256");
  CHECK(vs_policy_align(4 * MiB - 256) == 256, "just under 4 MiB aligned to 256");
  CHECK(vs_policy_align(4 * MiB) == 2 * MiB, "4 MiB aligned to 2 MiB");
}

static void test_grow_handle(void) {
  size_t gran = 64 * MiB, min = 2 * MiB;
  CHECK(vs_policy_grow_handle(VS_HEAP_LARGE, 0, gran, min, false) == min, "an empty heap grows by the minimum");
  CHECK(vs_policy_grow_handle(VS_HEAP_SMALL, 64 * MiB, gran, min, false) == 8 * MiB, "64 MiB mapped: 1/8 = 8 MiB");
  CHECK(vs_policy_grow_handle(VS_HEAP_LARGE, 17 * MiB, gran, min, false) == 4 * MiB,
        "17 MiB mapped: 1/8 rounded up to the minimum granularity = 4 MiB (got %zu)",
        vs_policy_grow_handle(VS_HEAP_LARGE, 17 * MiB, gran, min, false));
  CHECK(vs_policy_grow_handle(VS_HEAP_LARGE, 8 * GiB, gran, min, false) == gran, "8 GiB mapped: capped at the granularity");
  CHECK(vs_policy_grow_handle(VS_HEAP_LARGE, 8 * GiB, gran, min, true) == min, "exact: the minimum");
  CHECK(vs_policy_grow_handle(VS_HEAP_WHOLE, 8 * GiB, gran, min, false) == min, "whole heap: the minimum (own size)");
}

static void test_keep_idle(void) {
  size_t gran = 64 * MiB;
  /* idle beyond the growth goes, but the budget mapped/32 + one granularity stays */
  CHECK(vs_policy_keep_idle(300 * MiB, 30 * MiB, 320 * MiB, gran) == 270 * MiB, "idle 300, growth 30: keep 270");
  CHECK(vs_policy_keep_idle(100 * MiB, 30 * MiB, 320 * MiB, gran) == 74 * MiB,
        "idle 100, growth 30, mapped 320: keep the budget 10 + 64 = 74 MiB");
  CHECK(vs_policy_keep_idle(10 * MiB, 30 * MiB, 320 * MiB, gran) == 74 * MiB, "idle under the growth: keep the budget");
  CHECK(vs_policy_keep_recurring(10 * MiB, 800 * MiB) == 100 * MiB, "recurring sizes kept up to mapped/8");
  CHECK(vs_policy_keep_recurring(200 * MiB, 800 * MiB) == 200 * MiB, "never below what the first pass keeps");
}

static void test_whole_fits(void) {
  size_t size = 150 * MiB;
  CHECK(vs_policy_whole_fits(size, size), "an exact fit");
  CHECK(vs_policy_whole_fits(size + size / 15, size), "1/16 of the block wasted: fits");
  CHECK(!vs_policy_whole_fits(size + size / 15 + 2 * MiB, size), "more wasted: no");
  CHECK(!vs_policy_whole_fits(size - 2 * MiB, size), "a smaller block: no");
}

static void test_should_split(void) {
  CHECK(vs_policy_should_split(4 * KiB, 4 * KiB - 256), "a 256-byte remainder is a block");
  CHECK(!vs_policy_should_split(4 * KiB, 4 * KiB), "nothing left: no split");
  CHECK(!vs_policy_should_split(4 * KiB + 255, 4 * KiB), "less than 256 left: no split");
}

static void test_sync_before_growth(void) {
  CHECK(vs_policy_sync_before_growth(VS_HEAP_WHOLE, GiB, 2 * GiB, 4 * GiB), "deferred holds half the pool and enough");
  CHECK(!vs_policy_sync_before_growth(VS_HEAP_WHOLE, GiB, 2 * GiB - 1, 4 * GiB), "less than half: grow");
  CHECK(!vs_policy_sync_before_growth(VS_HEAP_WHOLE, 3 * GiB, 2 * GiB, 4 * GiB), "not enough for the request: grow");
  CHECK(!vs_policy_sync_before_growth(VS_HEAP_LARGE, MiB, 2 * GiB, 4 * GiB), "shared heaps never wait");
}

int main(void) {
  test_heap_for();
  test_align();
  test_grow_handle();
  test_keep_idle();
  test_whole_fits();
  test_should_split();
  test_sync_before_growth();
  return check_summary();
}
