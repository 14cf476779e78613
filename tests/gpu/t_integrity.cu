/* (a) Data integrity: many cudaMalloc allocations of mixed sizes (256 B .. 300 MiB, some
 * straddling the 64 MiB handles of the pool), each filled by a kernel with a pattern of
 * (allocation, offset) and verified by another kernel; half of them freed in random order and
 * allocated again with other sizes, then everything verified again. Checks that the pointers
 * are VMM memory, that no two live blocks overlap, and that the shim counted them. */
#include <algorithm>
#include <vector>

#include "gpu_test.cuh"

struct buf {
  void *p;
  size_t n;
  uint32_t seed;
};

static const size_t MiB = 1ull << 20;

static size_t pick_size(int i) {
  /* Fixed sizes first: around the 64 MiB handle boundaries, the extremes, odd sizes. */
  static const size_t fixed[] = {256,           257,           1000,          4096,       65539,
                                 1 * MiB,       2 * MiB - 1,   2 * MiB + 1,   63 * MiB,   64 * MiB - 256,
                                 64 * MiB,      64 * MiB + 256, 65 * MiB,     100 * MiB,  128 * MiB + 4096,
                                 200 * MiB,     300 * MiB,     32 * MiB + 3,  48 * MiB,   80 * MiB + 1};
  const int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
  if (i < nfixed) return fixed[i];
  return rnd_size(256, 32 * MiB);
}

static bool no_overlap(const std::vector<buf> &v, char *why, size_t whylen) {
  std::vector<std::pair<uintptr_t, size_t>> r;
  for (const buf &b : v)
    if (b.p) r.push_back({(uintptr_t)b.p, b.n});
  std::sort(r.begin(), r.end());
  for (size_t i = 1; i < r.size(); i++)
    if (r[i - 1].first + r[i - 1].second > r[i].first) {
      snprintf(why, whylen, "blocks %#lx+%zu and %#lx overlap", (unsigned long)r[i - 1].first, r[i - 1].second,
               (unsigned long)r[i].first);
      return false;
    }
  return true;
}

/* Fills every buffer whose flag is set, then verifies all; returns the mismatching words. */
static unsigned long long fill_and_verify(std::vector<buf> &v, const std::vector<char> &refill,
                                          unsigned long long *d_errs, int *bad_index) {
  for (size_t i = 0; i < v.size(); i++)
    if (refill[i]) fill(v[i].p, v[i].n, v[i].seed, 0);
  CK(cudaDeviceSynchronize());
  unsigned long long total = 0;
  *bad_index = -1;
  for (size_t i = 0; i < v.size(); i++) {
    CK(cudaMemset(d_errs, 0, sizeof *d_errs));
    verify(v[i].p, v[i].n, v[i].seed, d_errs, 0);
    unsigned long long e = 0;
    CK(cudaMemcpy(&e, d_errs, sizeof e, cudaMemcpyDeviceToHost));
    if (e && *bad_index < 0) *bad_index = (int)i;
    total += e;
  }
  return total;
}

int main(void) {
  g_prog = "integrity";
  CK(cudaFree(0));
  if (!require_shim()) return finish();
  vmmshim_stats_t s0, s1, s2;
  shim_stats(&s0);

  const int N = 180;
  unsigned long long *d_errs;
  CK(cudaMalloc(&d_errs, sizeof *d_errs));

  std::vector<buf> v(N);
  size_t total = 0;
  for (int i = 0; i < N; i++) {
    v[i].n = pick_size(i);
    v[i].seed = 1000u + (uint32_t)i;
    CK(cudaMalloc(&v[i].p, v[i].n));
    total += v[i].n;
  }
  printf("INFO integrity: %d allocations, %.1f MiB\n", N, total / (double)MiB);

  int not_vmm = 0, first_not_vmm = -1;
  for (int i = 0; i < N; i++)
    if (!is_vmm(v[i].p)) {
      not_vmm++;
      if (first_not_vmm < 0) first_not_vmm = i;
    }
  check(not_vmm == 0, "pointers-are-vmm", "%d of %d pointers are not VMM memory (first: #%d, %zu bytes)",
        not_vmm, N, first_not_vmm, first_not_vmm >= 0 ? v[first_not_vmm].n : 0);

  char why[256] = "";
  check(no_overlap(v, why, sizeof why), "no-overlap", "%s", why);

  std::vector<char> all(N, 1);
  int bad = -1;
  unsigned long long e = fill_and_verify(v, all, d_errs, &bad);
  check(e == 0, "verify-first", "%llu words differ (first bad: #%d, %zu bytes at %p)", e, bad,
        bad >= 0 ? v[bad].n : 0, bad >= 0 ? v[bad].p : NULL);

  shim_stats(&s1);
  check(stats_allocs(&s1) - stats_allocs(&s0) >= (uint64_t)N + 1, "stats-count-allocs",
        "shim counted %llu allocations, expected at least %d",
        (unsigned long long)(stats_allocs(&s1) - stats_allocs(&s0)), N + 1);
  check(s1.bytes_in_use >= total, "stats-bytes-in-use", "bytes_in_use %llu < %zu allocated",
        (unsigned long long)s1.bytes_in_use, total);
  print_stats("integrity after first round", &s1);

  /* Free a random half in random order, allocate them again with other sizes. */
  std::vector<int> order(N);
  for (int i = 0; i < N; i++) order[i] = i;
  shuffle(order.data(), N);
  std::vector<char> refill(N, 0);
  for (int k = 0; k < N / 2; k++) {
    int i = order[k];
    CK(cudaFree(v[i].p));
    v[i].p = NULL;
    refill[i] = 1;
  }
  int again = 0;
  for (int k = 0; k < N / 2; k++) {
    int i = order[k];
    v[i].n = pick_size((int)(rnd() % (uint64_t)N));
    v[i].seed = 5000u + (uint32_t)i;
    CK(cudaMalloc(&v[i].p, v[i].n));
    again += is_vmm(v[i].p);
  }
  check(again == N / 2, "realloc-are-vmm", "%d of %d reallocated pointers are VMM", again, N / 2);
  check(no_overlap(v, why, sizeof why), "no-overlap-after-realloc", "%s", why);
  e = fill_and_verify(v, refill, d_errs, &bad);
  check(e == 0, "verify-after-realloc", "%llu words differ (first bad: #%d, %zu bytes, %s)", e, bad,
        bad >= 0 ? v[bad].n : 0, bad >= 0 ? (refill[bad] ? "reallocated" : "survivor") : "-");

  /* Free everything in random order. */
  shuffle(order.data(), N);
  for (int k = 0; k < N; k++) CK(cudaFree(v[order[k]].p));
  CK(cudaFree(d_errs));
  CK(cudaDeviceSynchronize());
  /* 2D memsets and a 3D peer copy: the runtime reaches the driver through the shim's gated
   * entry points (cuMemsetD2D8*, cuMemcpy3DPeer*), which must take and pass every argument. */
  {
    const size_t pitch = 1024, width = 1000, rows = 8;
    unsigned char *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, pitch * rows));
    CK(cudaMalloc(&b, pitch * rows));
    CK(cudaMemset2DAsync(a, pitch, 0, pitch, rows, 0));
    CK(cudaMemset2D(a, pitch, 0x5a, width, rows));
    CK(cudaMemset2DAsync(b, pitch, 0x11, pitch, rows, 0));
    cudaMemcpy3DPeerParms pp;
    memset(&pp, 0, sizeof pp);
    pp.srcPtr = make_cudaPitchedPtr(a, pitch, width, rows);
    pp.dstPtr = make_cudaPitchedPtr(b, pitch, width, rows);
    pp.extent = make_cudaExtent(width, rows, 1);
    CK(cudaMemcpy3DPeerAsync(&pp, 0));
    CK(cudaDeviceSynchronize());
    unsigned char h[2][1024 * 8];
    CK(cudaMemcpy(h[0], a, pitch * rows, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h[1], b, pitch * rows, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t y = 0; y < rows; y++)
      for (size_t x = 0; x < pitch; x++) {
        wrong += h[0][y * pitch + x] != (x < width ? 0x5a : 0);
        wrong += h[1][y * pitch + x] != (x < width ? 0x5a : 0x11);
      }
    check(wrong == 0, "memset2d-copy3dpeer", "%zu bytes wrong after 2D memsets and a 3D peer copy", wrong);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  shim_stats(&s2);
  uint64_t frees = stats_frees(&s2) - stats_frees(&s0);
  check(frees >= (uint64_t)(N + N / 2 + 1), "stats-count-frees", "shim counted %llu frees, expected %d",
        (unsigned long long)frees, N + N / 2 + 1);
  check(s2.bytes_in_use <= s0.bytes_in_use, "stats-all-freed", "bytes_in_use %llu after freeing all (was %llu)",
        (unsigned long long)s2.bytes_in_use, (unsigned long long)s0.bytes_in_use);
  print_stats("integrity at end", &s2);
  return finish();
}
