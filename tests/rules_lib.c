/* rules_lib.c: one shared object of test_shim_rules, built twice (librules_a.so and
 * librules_b.so, RULES_FN naming the function): a library that allocates for its caller, whose
 * allocations `lib:` rules tag by the library's name. */
#include <cuda_runtime_api.h>
#include <stddef.h>

__attribute__((visibility("default"), noinline)) void *RULES_FN(size_t n) {
  void *p = NULL;
  void *out = cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
  __asm__ volatile("" ::: "memory"); /* the call stays a call, not a tail call */
  return out;
}
