/* First-time growth: in a fresh process, allocate <total> bytes in cudaMalloc requests of
 * <request> bytes and time it (then the frees, separately).
 *
 *   growth <label> <total> <request>        (sizes as 64M, 1G, ...)
 *
 * Prints R growth cfg=<label> total=.. request=.. n=.. alloc_us=.. us_per_gib=.. first_us=.. free_us=..
 * or, when the device has too little free memory, the same with skipped=1. bench/run.sh runs it
 * without the shim and under it with several VMMSHIM_GRANULARITY values. */
#include <vector>

#include "bench.cuh"

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: growth <label> <total> <request>\n");
    return 2;
  }
  const char *label = argv[1];
  size_t total = parse_size(argv[2]), req = parse_size(argv[3]);
  size_t n = (total + req - 1) / req;
  CK(cudaSetDevice(0));
  CK(cudaFree(0)); /* context creation, outside the timing */
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < n * req + (1ull << 30)) {
    printf("R growth cfg=%s total=%zu request=%zu skipped=1 free=%zu\n", label, total, req, free_b);
    return 0;
  }
  std::vector<void *> p(n);
  double t0 = now_us();
  CK(cudaMalloc(&p[0], req));
  double t1 = now_us();
  for (size_t i = 1; i < n; i++) CK(cudaMalloc(&p[i], req));
  double t2 = now_us();
  for (size_t i = 0; i < n; i++) CK(cudaFree(p[i]));
  double t3 = now_us();
  double gib = (double)(n * req) / (1u << 30);
  printf("R growth cfg=%s total=%zu request=%zu n=%zu alloc_us=%.1f us_per_gib=%.1f first_us=%.1f free_us=%.1f", label,
         total, req, n, t2 - t0, (t2 - t0) / gib, t1 - t0, t3 - t2);
  print_shim_fields();
  printf("\n");
  return 0;
}
