/* rules_lib.c: the shared objects of test_shim_rules, built three times from this file:
 *   librmm.so      RULES_FN=rules_pool_alloc: a stand-in for an allocator library that allocates
 *                  for others (its name is one `lib:` rules look past, as RAPIDS RMM's);
 *   librules_a.so, librules_b.so  RULES_FN=rules_lib_a_alloc / _b_alloc, RULES_VIA=..._via:
 *                  libraries that allocate for their caller directly, and through librmm.so.
 * `lib:` rules tag their allocations by the library's name. */
#include <cuda_runtime_api.h>
#include <stddef.h>

__attribute__((visibility("default"), noinline)) void *RULES_FN(size_t n) {
  void *p = NULL;
  void *out = cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
  __asm__ volatile("" ::: "memory"); /* the call stays a call, not a tail call */
  return out;
}

#ifdef RULES_VIA
void *rules_pool_alloc(size_t n); /* librmm.so */

__attribute__((visibility("default"), noinline)) void *RULES_VIA(size_t n) {
  void *out = rules_pool_alloc(n);
  __asm__ volatile("" ::: "memory");
  return out;
}
#endif
