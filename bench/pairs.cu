/* Allocation + free pair latency and throughput.
 *
 *   pairs <malloc|async|drv|drvasync|floor> <label> <threads,...> <size> [size...]
 *
 * malloc: cudaMalloc + cudaFree.  async: cudaMallocAsync + cudaFreeAsync on the thread's own
 * non-blocking stream, with the device's default pool kept warm (release threshold UINT64_MAX;
 * harmless under the shim, which serves these itself). drv / drvasync: the same through the
 * driver API (cuMemAlloc_v2 + cuMemFree_v2, cuMemAllocAsync + cuMemFreeAsync, looked up with
 * cudaGetDriverEntryPointByVersion): the runtime's own cost left out. floor: an empty pair,
 * what the clock reads alone add to every median. For each size and thread count, every
 * thread warms up (all threads together, after a barrier, so that an allocator that spreads
 * contending threads has done so: at least 100 pairs and 20 ms), waits at a second barrier,
 * then runs pairs for 100 ms (at least 20, at most 2 million), timing each with clock_gettime;
 * prints
 *   R pairs cfg=<label> size=<bytes> threads=<n> pairs=<total> median_us=.. p99_us=.. pairs_per_s=..
 * pairs_per_s counts all threads' pairs over the wall time from the first start to the last end.
 * Run by bench/run.sh once per configuration, with and without LD_PRELOAD. */
#include <pthread.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "bench.cuh"

#include <cuda.h>

enum mode_t_ { M_MALLOC, M_ASYNC, M_DRV, M_DRVASYNC, M_FLOOR };
static int g_mode = M_MALLOC;
static bool g_async = false; /* the mode uses a stream */
typedef CUresult (*alloc_v2_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_v2_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
static alloc_v2_fn d_alloc;
static free_v2_fn d_free;
static alloc_async_fn d_alloc_async;
static free_async_fn d_free_async;

#define DK(call)                                                                 \
  do {                                                                           \
    CUresult dk_r_ = (call);                                                     \
    if (dk_r_ != CUDA_SUCCESS) {                                                 \
      printf("ERROR %s: CUresult %d\n", #call, (int)dk_r_);                      \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

static void *driver_fn(const char *name, int version) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) {
    printf("ERROR driver entry point %s not found\n", name);
    exit(1);
  }
  return fn;
}

static inline void one_pair(void **p, size_t size, cudaStream_t s) {
  CUdeviceptr d;
  switch (g_mode) {
  case M_MALLOC: CK(cudaMalloc(p, size)); CK(cudaFree(*p)); break;
  case M_ASYNC: CK(cudaMallocAsync(p, size, s)); CK(cudaFreeAsync(*p, s)); break;
  case M_DRV: DK(d_alloc(&d, size)); DK(d_free(d)); break;
  case M_DRVASYNC: DK(d_alloc_async(&d, size, (CUstream)s)); DK(d_free_async(d, (CUstream)s)); break;
  default: break;
  }
}

static const double WARM_US = 20000, RUN_US = 100000;
static const int WARM_MIN = 100, RUN_MIN = 20, RUN_MAX = 2000000;

struct job {
  size_t size;
  pthread_barrier_t *bar;
  std::vector<double> lat;
  double start, end;
};

static void pair_loop_at(job *j);

/* PAIRS_DEPTH=N: the pairs run N nested calls down, as a program's allocations do (what a
 * traced stack costs depends on it). */
static int g_depth;
static __attribute__((noinline)) void pair_loop_deep(int depth, job *j) {
  if (depth <= 0) {
    pair_loop_at(j);
    return;
  }
  pair_loop_deep(depth - 1, j);
  __asm__ volatile("" ::: "memory"); /* no tail call: every level stays a frame */
}
static void pair_loop(job *j) { pair_loop_deep(g_depth, j); }

static void pair_loop_at(job *j) {
  CK(cudaSetDevice(0));
  cudaStream_t s = 0;
  if (g_async) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *p;
  j->lat.reserve(RUN_MAX);
  pthread_barrier_wait(j->bar);
  double w0 = now_us();
  for (int i = 0; i < WARM_MIN || now_us() - w0 < WARM_US; i++) one_pair(&p, j->size, s);
  if (g_async) CK(cudaStreamSynchronize(s));
  pthread_barrier_wait(j->bar);
  j->start = now_us();
  double t1 = j->start;
  for (int i = 0; i < RUN_MAX && (i < RUN_MIN || t1 - j->start < RUN_US); i++) {
    double t0 = now_us();
    one_pair(&p, j->size, s);
    t1 = now_us();
    j->lat.push_back(t1 - t0);
  }
  j->end = t1;
  if (g_async) {
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
  }
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: pairs <malloc|async|drv|drvasync|floor> <label> <threads,...> <size> [size...]\n");
    return 2;
  }
  static const char *modes[] = {"malloc", "async", "drv", "drvasync", "floor"};
  g_mode = -1;
  for (int m = 0; m < 5; m++)
    if (!strcmp(argv[1], modes[m])) g_mode = m;
  if (g_mode < 0) {
    fprintf(stderr, "pairs: unknown mode %s\n", argv[1]);
    return 2;
  }
  g_async = g_mode == M_ASYNC || g_mode == M_DRVASYNC;
  if (getenv("PAIRS_DEPTH")) g_depth = atoi(getenv("PAIRS_DEPTH"));
  const char *label = argv[2];
  std::vector<int> tcounts;
  for (char *t = strtok(argv[3], ","); t; t = strtok(NULL, ",")) tcounts.push_back(atoi(t));

  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  if (g_mode == M_DRV) {
    d_alloc = (alloc_v2_fn)driver_fn("cuMemAlloc", 3020);
    d_free = (free_v2_fn)driver_fn("cuMemFree", 3020);
  } else if (g_mode == M_DRVASYNC) {
    d_alloc_async = (alloc_async_fn)driver_fn("cuMemAllocAsync", 11020);
    d_free_async = (free_async_fn)driver_fn("cuMemFreeAsync", 11020);
  }
  if (g_async) {
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t thr = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  }
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));

  for (int a = 4; a < argc; a++) {
    size_t size = parse_size(argv[a]);
    for (int threads : tcounts) {
      if ((double)size * threads > 0.8 * (double)free_b) {
        printf("R pairs cfg=%s size=%zu threads=%d skipped=1\n", label, size, threads);
        continue;
      }
      pthread_barrier_t bar;
      pthread_barrier_init(&bar, NULL, threads);
      std::vector<job> jobs(threads);
      std::vector<std::thread> th;
      for (int t = 0; t < threads; t++) {
        jobs[t].size = size;
        jobs[t].bar = &bar;
        th.emplace_back(pair_loop, &jobs[t]);
      }
      for (auto &x : th) x.join();
      pthread_barrier_destroy(&bar);
      std::vector<double> all;
      double start = jobs[0].start, end = jobs[0].end;
      for (auto &j : jobs) {
        all.insert(all.end(), j.lat.begin(), j.lat.end());
        start = std::min(start, j.start);
        end = std::max(end, j.end);
      }
      std::sort(all.begin(), all.end());
      size_t n = all.size();
      double med = all[n / 2], p99 = all[std::min(n - 1, (size_t)(n * 0.99))];
      printf("R pairs cfg=%s size=%zu threads=%d pairs=%zu median_us=%.3f p99_us=%.3f pairs_per_s=%.1f\n", label,
             size, threads, n, med, p99, n / ((end - start) / 1e6));
      fflush(stdout);
    }
  }
  printf("R pairs_done cfg=%s", label);
  print_shim_fields();
  printf("\n");
  return 0;
}
