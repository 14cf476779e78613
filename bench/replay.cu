/* Replays an allocation trace and reports how much memory the allocator held for it.
 *
 *   replay <trace> <malloc|async> <label>
 *
 * Trace format (bench/gen_trace.py writes it): '#' lines are comments; every other line is
 *   a <id> <size>     allocate <size> bytes, remember the pointer as <id> (ids 0, 1, 2, ...)
 *   f <id>            free the pointer of <id>
 * malloc: cudaMalloc/cudaFree. async: cudaMallocAsync/cudaFreeAsync on one stream, the default
 * pool with release threshold UINT64_MAX (reports its ReservedMemHigh and UsedMemHigh).
 * Under the shim, its stats give peak_bytes_mapped and peak_bytes_in_use. Prints
 *   R frag cfg=<label> trace=<file name> events=.. allocs=.. peak_live=<requested bytes> time_ms=.. [pool_* | shim_*]
 * The memory is not touched: this measures the allocators' bookkeeping and footprint only. */
#include <vector>

#include "bench.cuh"

struct ev {
  char op;
  unsigned id;
  size_t size;
};

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: replay <trace> <malloc|async> <label>\n");
    return 2;
  }
  bool async = strcmp(argv[2], "async") == 0;
  const char *label = argv[3];
  FILE *f = fopen(argv[1], "r");
  if (!f) {
    perror(argv[1]);
    return 2;
  }
  std::vector<ev> evs;
  char line[256];
  unsigned max_id = 0;
  while (fgets(line, sizeof line, f)) {
    ev e = {0, 0, 0};
    unsigned long long sz = 0;
    if (line[0] == '#' || line[0] == '\n') continue;
    if (sscanf(line, "a %u %llu", &e.id, &sz) == 2) {
      e.op = 'a';
      e.size = (size_t)sz;
    } else if (sscanf(line, "f %u", &e.id) == 1) {
      e.op = 'f';
    } else {
      fprintf(stderr, "replay: bad line: %s", line);
      return 2;
    }
    if (e.id > max_id) max_id = e.id;
    evs.push_back(e);
  }
  fclose(f);

  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  cudaStream_t s = 0;
  cudaMemPool_t pool;
  if (async) {
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  }
  std::vector<void *> ptr(max_id + 1, nullptr);
  std::vector<size_t> size(max_id + 1, 0);
  size_t live = 0, peak = 0, allocs = 0;
  double t0 = now_us();
  for (size_t i = 0; i < evs.size(); i++) {
    const ev &e = evs[i];
    if (e.op == 'a') {
      cudaError_t r = async ? cudaMallocAsync(&ptr[e.id], e.size, s) : cudaMalloc(&ptr[e.id], e.size);
      if (r != cudaSuccess) {
        printf("R frag cfg=%s failed=1 at_event=%zu size=%zu live=%zu error=%s\n", label, i, e.size, live,
               cudaGetErrorName(r));
        return 1;
      }
      size[e.id] = e.size;
      live += e.size;
      allocs++;
      if (live > peak) peak = live;
    } else {
      if (!ptr[e.id]) continue;
      CK(async ? cudaFreeAsync(ptr[e.id], s) : cudaFree(ptr[e.id]));
      ptr[e.id] = nullptr;
      live -= size[e.id];
    }
  }
  if (async) CK(cudaStreamSynchronize(s));
  double t1 = now_us();
  const char *base = strrchr(argv[1], '/');
  printf("R frag cfg=%s trace=%s events=%zu allocs=%zu peak_live=%zu time_ms=%.1f", label, base ? base + 1 : argv[1],
         evs.size(), allocs, peak, (t1 - t0) / 1e3);
  if (async) print_pool_high(pool);
  print_shim_fields();
  printf("\n");
  for (unsigned id = 0; id <= max_id; id++)
    if (ptr[id]) CK(async ? cudaFreeAsync(ptr[id], s) : cudaFree(ptr[id]));
  if (async) CK(cudaStreamSynchronize(s));
  return 0;
}
