/* test_shim_peer: other devices' access to the shim's memory, on 2 or 3 emulated devices, one
 * process per scenario (the device count is set before cuInit, the shim reads its options once).
 *
 * Who may touch what is asked of the emulation (emu_device_access: a kernel or copy engine of a
 * device reading or writing a range, checked against each mapping's access flags); every refusal
 * the test expects is counted, and at the end the emulation must have counted exactly those
 * (emu_device_faults) and no other contract violation.
 *
 * What the driver grants, and what the shim grants on its pool memory:
 *   - cudaDeviceEnablePeerAccess(peer) from device d: the driver gives d the peer's cudaMalloc
 *     memory (not its cudaMallocAsync memory); cudaMemPoolSetAccess on a device's default pool
 *     gives the peer that pool's cudaMallocAsync memory (READ or READWRITE), not its cudaMalloc
 *     memory.
 *   - The shim serves both from the same handles of one context's pools, and access is set per
 *     mapping, so it grants the union: every reason a device has (peer access, pool access,
 *     VMMSHIM_PEER_ACCESS=all) applies to all of the context's pool memory; peer access gives
 *     read-write, pool access what it says, and the strongest wins. Asserted: a device gets at
 *     least what the driver would give it (a correct program keeps working) and nothing while it
 *     has no reason at all (before any grant, after every grant is taken back, devices the
 *     grants do not name).
 *
 *   auto    default: no access before a grant; peer access gives device 1 read-write on existing
 *           blocks (cudaMalloc and cudaMallocAsync) and on blocks of later growth (a block with a
 *           handle of its own, small-heap growth, stream-ordered growth); the grant is one way;
 *           data written by device 1 is read back by device 0; disabling revokes it everywhere,
 *           and growth after it is the owner's alone; pool access READ / READWRITE / NONE for one
 *           and two peers, and its union with peer access.
 *   early   grants made before the target context's first allocation reach its pools.
 *   reset   a reset of the device that enabled peer access drops its grant (as the driver
 *           does), enabling again works and disabling takes it away (no count left behind); a
 *           reset of the memory's device drops every grant to it.
 *   all     VMMSHIM_PEER_ACCESS=all (and VMMSHIM_VERBOSE=1): every device that can access the
 *           owner gets read-write from the first mapping, without any call; a device that
 *           cannot (emu_set_peer_capable) gets nothing; disabling peer access or pool access
 *           takes nothing away.
 *   none    VMMSHIM_PEER_ACCESS=none: the program runs, the driver's calls succeed, no other
 *           device ever gets access to pool memory.
 *   bad     VMMSHIM_PEER_ACCESS=sometimes: a message naming the variable, the value and the
 *           choices; auto is used.
 *   log     VMMSHIM_LOG=info: the cuMemSetAccess lines list every device's flags (READWRITE,
 *           READ, NONE) as they change.
 *   race    VMMSHIM_RELEASE_THRESHOLD=0: one thread allocates and frees (pools grow, idle handles
 *           are unmapped) while another turns peer and pool access on and off; afterwards every
 *           live block has the access of the final state, and no access change ever touched an
 *           unmapped range (no contract violation).
 *
 * The emulated runtime has no cudaMemcpy: a copy by device d is modelled by dev_write/dev_read
 * below (the emulation's access check for d, then the bytes through the host view, which the
 * emulation shares between devices as a GPU's memory is shared by peer mappings). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

static long g_faults; /* refusals of emu_device_access this test expects */

/* What device dev may do on [p, p+n): want is "rw", "r" or "" (neither). */
#define ACCESS(dev, p, n, want) check_access(__LINE__, dev, p, n, want)
static void check_access(int line, int dev, const void *p, size_t n, const char *want) {
  int r_want = strchr(want, 'r') != NULL, w_want = strchr(want, 'w') != NULL;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
  int r = emu_device_access(dev, d, n, 0) == 0;
  int w = emu_device_access(dev, d, n, 1) == 0;
  g_faults += !r_want + !w_want;
  CHECK(r == r_want && w == w_want, "line %d: device %d on %p (%zu bytes): read %s, write %s; want \"%s\"", line, dev,
        p, n, r ? "allowed" : "refused", w ? "allowed" : "refused", want);
}

/* A copy by device dev into device memory, and out of it (see the top). 0 when dev may. */
static int dev_write(int dev, void *dst, const void *src, size_t n) {
  if (emu_device_access(dev, (CUdeviceptr)(uintptr_t)dst, n, 1) != 0) return -1;
  memcpy(dst, src, n);
  return 0;
}
static int dev_read(int dev, void *dst, const void *src, size_t n) {
  if (emu_device_access(dev, (CUdeviceptr)(uintptr_t)src, n, 0) != 0) return -1;
  memcpy(dst, src, n);
  return 0;
}

static void set_device(int dev) { CHECK(cudaSetDevice(dev) == cudaSuccess, "cudaSetDevice(%d)", dev); }

static void enable_peer(int from, int to) {
  set_device(from);
  cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
  CHECK(e == cudaSuccess, "cudaDeviceEnablePeerAccess(%d) on device %d: %s", to, from, cudaGetErrorName(e));
}

static void disable_peer(int from, int to) {
  set_device(from);
  cudaError_t e = cudaDeviceDisablePeerAccess(to);
  CHECK(e == cudaSuccess, "cudaDeviceDisablePeerAccess(%d) on device %d: %s", to, from, cudaGetErrorName(e));
}

/* cudaMemPoolSetAccess on dev's default pool for one peer. */
static void pool_access(int dev, int peer, enum cudaMemAccessFlags flags) {
  cudaMemPool_t pool = NULL;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess && pool, "default pool of device %d", dev);
  struct cudaMemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = cudaMemLocationTypeDevice;
  d.location.id = peer;
  d.flags = flags;
  cudaError_t e = cudaMemPoolSetAccess(pool, &d, 1);
  CHECK(e == cudaSuccess, "cudaMemPoolSetAccess(device %d's pool, peer %d, %d): %s", dev, peer, (int)flags,
        cudaGetErrorName(e));
  enum cudaMemAccessFlags got = cudaMemAccessFlagsProtNone;
  struct cudaMemLocation loc = d.location;
  CHECK(cudaMemPoolGetAccess(&got, pool, &loc) == cudaSuccess && got == flags, "the pool says %d", (int)got);
}

static void *must_malloc_async(size_t n, cudaStream_t s) {
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, n, s);
  CHECK(e == cudaSuccess && p, "cudaMallocAsync(%zu): %s", n, cudaGetErrorName(e));
  return p;
}

/* Every refusal was one the test asked for, and nothing else broke the driver's contract. */
static void check_faults(void) {
  CHECK(emu_device_faults() == g_faults, "the emulation refused %ld device accesses, the test expected %ld",
        emu_device_faults(), g_faults);
  CHECK(emu_violations() == (int)g_faults, "%d contract violations, %ld of them expected refusals", emu_violations(),
        g_faults);
}

/* ------------------------------------------------------------------ auto */

static void scenario_auto(void) {
  emu_set_device_count(3);
  set_device(0);
  int can = 0;
  CHECK(cudaDeviceCanAccessPeer(&can, 1, 0) == cudaSuccess && can, "device 1 can access device 0");
  cudaStream_t s0;
  CHECK(cudaStreamCreate(&s0) == cudaSuccess, "stream on device 0");
  void *m = must_malloc(4 * MiB), *a = must_malloc_async(4 * MiB, s0), *small = must_malloc(64 * KiB);

  /* Before any grant: the owner alone. */
  ACCESS(0, m, 4 * MiB, "rw");
  ACCESS(0, a, 4 * MiB, "rw");
  ACCESS(1, m, 4 * MiB, "");
  ACCESS(1, a, 4 * MiB, "");
  ACCESS(1, small, 64 * KiB, "");
  ACCESS(2, m, 4 * MiB, "");
  CHECK(emu_device_faults() == g_faults, "refusals counted one by one: %ld, want %ld", emu_device_faults(), g_faults);

  /* Device 1 enables peer access to device 0: read-write on what exists (cudaMalloc, as the
   * driver gives; cudaMallocAsync, by the union). */
  enable_peer(1, 0);
  void *m1 = must_malloc(MiB); /* device 1's own memory */
  ACCESS(1, m, 4 * MiB, "rw");
  ACCESS(1, a, 4 * MiB, "rw");
  ACCESS(1, small, 64 * KiB, "rw");
  ACCESS(2, m, 4 * MiB, "");
  ACCESS(2, a, 4 * MiB, "");
  ACCESS(0, m1, MiB, ""); /* one way: device 0 did not enable access to device 1 */
  ACCESS(1, m1, MiB, "rw");

  /* Growth after the grant: a block with a handle of its own, small blocks until the small heap
   * grows, and stream-ordered growth. */
  set_device(0);
  uint64_t mapped = shim_stats().bytes_mapped;
  void *big = must_malloc(256 * MiB);
  CHECK(shim_stats().bytes_mapped >= mapped + 256 * MiB, "256 MiB mapped anew: %llu -> %llu",
        (unsigned long long)mapped, (unsigned long long)shim_stats().bytes_mapped);
  ACCESS(1, big, 256 * MiB, "rw");
  ACCESS(2, big, 256 * MiB, "");
  enum { NS = 400 };
  static void *sm[NS];
  int ns = 0;
  mapped = shim_stats().bytes_mapped;
  while (ns < NS && shim_stats().bytes_mapped == mapped) sm[ns++] = must_malloc(512 * KiB);
  CHECK(shim_stats().bytes_mapped > mapped, "the small heap grew within %d blocks of 512 KiB", ns);
  for (int i = 0; i < ns; i++) ACCESS(1, sm[i], 512 * KiB, "rw");
  mapped = shim_stats().bytes_mapped;
  void *abig = must_malloc_async(128 * MiB, s0);
  CHECK(shim_stats().bytes_mapped > mapped, "stream-ordered growth");
  ACCESS(1, abig, 128 * MiB, "rw");

  /* Data written by device 1 through its peer access is read by device 0. */
  static unsigned char buf[MiB], back[MiB];
  pat_fill(buf, sizeof buf, 41);
  CHECK(dev_write(1, big, buf, sizeof buf) == 0, "device 1 writes device 0's block");
  CHECK(dev_write(1, (char *)abig + 64 * MiB, buf, sizeof buf) == 0, "device 1 writes a stream-ordered block");
  memset(back, 0, sizeof back);
  CHECK(dev_read(0, back, big, sizeof back) == 0 && pat_check(back, sizeof back, 41) == (size_t)-1,
        "device 0 reads what device 1 wrote");
  memset(back, 0, sizeof back);
  CHECK(dev_read(0, back, (char *)abig + 64 * MiB, sizeof back) == 0 && pat_check(back, sizeof back, 41) == (size_t)-1,
        "device 0 reads what device 1 wrote (stream-ordered)");
  pat_fill(buf, sizeof buf, 42);
  CHECK(dev_write(0, m, buf, sizeof buf) == 0, "device 0 writes");
  memset(back, 0, sizeof back);
  CHECK(dev_read(1, back, m, sizeof back) == 0 && pat_check(back, sizeof back, 42) == (size_t)-1,
        "device 1 reads what device 0 wrote");

  /* Disabling takes it back from every mapping, old and grown, and later growth stays closed. */
  disable_peer(1, 0);
  ACCESS(1, m, 4 * MiB, "");
  ACCESS(1, a, 4 * MiB, "");
  ACCESS(1, big, 256 * MiB, "");
  ACCESS(1, sm[ns - 1], 512 * KiB, "");
  ACCESS(1, abig, 128 * MiB, "");
  ACCESS(0, big, 256 * MiB, "rw");
  set_device(0);
  void *big2 = must_malloc(256 * MiB);
  ACCESS(1, big2, 256 * MiB, "");
  ACCESS(0, big2, 256 * MiB, "rw");
  set_device(1);
  CHECK(cudaDeviceDisablePeerAccess(0) == cudaErrorPeerAccessNotEnabled, "a second disable is refused by the driver");
  cudaGetLastError();

  /* Pool access: READ, then READWRITE, then NONE; on the async blocks as the driver gives, on
   * the others by the union; blocks mapped meanwhile follow. */
  pool_access(0, 1, cudaMemAccessFlagsProtRead);
  ACCESS(1, a, 4 * MiB, "r");
  ACCESS(1, abig, 128 * MiB, "r");
  ACCESS(1, m, 4 * MiB, "r");
  ACCESS(2, a, 4 * MiB, "");
  set_device(0);
  void *abig2 = must_malloc_async(128 * MiB, s0);
  ACCESS(1, abig2, 128 * MiB, "r");
  CHECK(dev_read(1, back, abig, sizeof back) == 0, "device 1 reads with READ");
  pool_access(0, 1, cudaMemAccessFlagsProtReadWrite);
  ACCESS(1, a, 4 * MiB, "rw");
  ACCESS(1, abig2, 128 * MiB, "rw");
  /* Peer access on top of pool READ: read-write while both hold, READ once peer access goes. */
  pool_access(0, 1, cudaMemAccessFlagsProtRead);
  enable_peer(1, 0);
  ACCESS(1, a, 4 * MiB, "rw");
  ACCESS(1, m, 4 * MiB, "rw");
  disable_peer(1, 0);
  ACCESS(1, a, 4 * MiB, "r");
  ACCESS(1, m, 4 * MiB, "r");
  /* Two peers at once, different flags. */
  pool_access(0, 2, cudaMemAccessFlagsProtReadWrite);
  ACCESS(2, a, 4 * MiB, "rw");
  ACCESS(1, a, 4 * MiB, "r");
  pool_access(0, 1, cudaMemAccessFlagsProtNone);
  ACCESS(1, a, 4 * MiB, "");
  ACCESS(1, big2, 256 * MiB, "");
  ACCESS(2, big2, 256 * MiB, "rw");
  pool_access(0, 2, cudaMemAccessFlagsProtNone);
  ACCESS(2, a, 4 * MiB, "");
  ACCESS(2, abig2, 128 * MiB, "");
  ACCESS(0, abig2, 128 * MiB, "rw");
  /* Device 1's memory was never granted to anyone. */
  ACCESS(0, m1, MiB, "");
  ACCESS(2, m1, MiB, "");

  set_device(0);
  CHECK(cudaFree(m) == cudaSuccess && cudaFree(small) == cudaSuccess && cudaFree(big) == cudaSuccess &&
            cudaFree(big2) == cudaSuccess,
        "frees");
  for (int i = 0; i < ns; i++) CHECK(cudaFree(sm[i]) == cudaSuccess, "free");
  CHECK(cudaFreeAsync(a, s0) == cudaSuccess && cudaFreeAsync(abig, s0) == cudaSuccess &&
            cudaFreeAsync(abig2, s0) == cudaSuccess,
        "async frees");
  CHECK(cudaStreamSynchronize(s0) == cudaSuccess && cudaStreamDestroy(s0) == cudaSuccess, "stream");
  set_device(1);
  CHECK(cudaFree(m1) == cudaSuccess, "free on device 1");
  check_faults();
}

/* ------------------------------------------------------------------ early */

static void scenario_early(void) {
  emu_set_device_count(3);
  /* Grants to device 1 before device 1 has allocated anything (its context exists: the runtime
   * made it for the peer call). */
  enable_peer(2, 1);
  pool_access(1, 0, cudaMemAccessFlagsProtRead);
  set_device(1);
  void *m = must_malloc(MiB);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *a = must_malloc_async(MiB, s);
  void *big = must_malloc(128 * MiB);
  ACCESS(2, m, MiB, "rw");
  ACCESS(2, a, MiB, "rw");
  ACCESS(2, big, 128 * MiB, "rw");
  ACCESS(0, m, MiB, "r");
  ACCESS(0, a, MiB, "r");
  ACCESS(0, big, 128 * MiB, "r");
  ACCESS(1, big, 128 * MiB, "rw");
  /* Device 0 allocates after that: nobody asked for its memory. */
  set_device(0);
  void *z = must_malloc(MiB);
  ACCESS(1, z, MiB, "");
  ACCESS(2, z, MiB, "");
  CHECK(cudaFree(z) == cudaSuccess, "free");
  set_device(1);
  CHECK(cudaFree(m) == cudaSuccess && cudaFree(big) == cudaSuccess && cudaFreeAsync(a, s) == cudaSuccess, "frees");
  CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "stream");
  check_faults();
}

/* ------------------------------------------------------------------ reset */

static void scenario_reset(void) {
  emu_set_device_count(2);
  set_device(0);
  void *m = must_malloc(MiB);
  enable_peer(1, 0);
  ACCESS(1, m, MiB, "rw");
  /* The context that enabled access goes away: so does its grant (the driver drops it too). */
  set_device(1);
  CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset on device 1");
  ACCESS(1, m, MiB, "");
  enable_peer(1, 0);
  ACCESS(1, m, MiB, "rw");
  disable_peer(1, 0); /* the one grant there is: nothing left behind by the reset */
  ACCESS(1, m, MiB, "");
  /* The memory's own context goes away: grants to it go with it. */
  enable_peer(1, 0);
  set_device(0);
  CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset on device 0");
  set_device(0);
  void *m2 = must_malloc(MiB);
  ACCESS(1, m2, MiB, "");
  ACCESS(0, m2, MiB, "rw");
  enable_peer(1, 0); /* the driver forgot it too: enabling again succeeds */
  ACCESS(1, m2, MiB, "rw");
  set_device(0);
  CHECK(cudaFree(m2) == cudaSuccess, "free");
  check_faults();
}

/* ------------------------------------------------------------------ all, none, bad */

static void scenario_all(void) {
  emu_set_device_count(3);
  emu_set_peer_capable(2, 0, 0); /* device 2 cannot access device 0 (device 0 can access device 2) */
  set_device(0);
  int can = 1;
  CHECK(cudaDeviceCanAccessPeer(&can, 2, 0) == cudaSuccess && !can, "device 2 cannot access device 0");
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *m = must_malloc(MiB), *a = must_malloc_async(MiB, s), *big = must_malloc(256 * MiB);
  ACCESS(1, m, MiB, "rw");
  ACCESS(1, a, MiB, "rw");
  ACCESS(1, big, 256 * MiB, "rw");
  ACCESS(2, m, MiB, "");
  ACCESS(2, big, 256 * MiB, "");
  set_device(2);
  void *m2 = must_malloc(MiB);
  ACCESS(0, m2, MiB, "rw");
  ACCESS(1, m2, MiB, "rw");
  /* Explicit grants and their withdrawal change nothing. */
  enable_peer(1, 0);
  disable_peer(1, 0);
  pool_access(0, 1, cudaMemAccessFlagsProtRead);
  pool_access(0, 1, cudaMemAccessFlagsProtNone);
  ACCESS(1, m, MiB, "rw");
  ACCESS(1, a, MiB, "rw");
  set_device(0);
  CHECK(cudaFree(m) == cudaSuccess && cudaFree(big) == cudaSuccess && cudaFreeAsync(a, s) == cudaSuccess, "frees");
  CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "stream");
  set_device(2);
  CHECK(cudaFree(m2) == cudaSuccess, "free");
  check_faults();
}

static void scenario_none(void) {
  emu_set_device_count(2);
  set_device(0);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *m = must_malloc(MiB), *a = must_malloc_async(MiB, s);
  enable_peer(1, 0);
  pool_access(0, 1, cudaMemAccessFlagsProtReadWrite);
  set_device(0);
  void *big = must_malloc(256 * MiB);
  ACCESS(1, m, MiB, "");
  ACCESS(1, a, MiB, "");
  ACCESS(1, big, 256 * MiB, "");
  ACCESS(0, big, 256 * MiB, "rw");
  /* The program runs as before: its own device reads and writes, frees and reuse work. */
  pat_fill_sparse(big, 256 * MiB, 7);
  CHECK(pat_check_sparse(big, 256 * MiB, 7) == (size_t)-1, "data");
  CHECK(cudaFree(big) == cudaSuccess && cudaFree(m) == cudaSuccess && cudaFreeAsync(a, s) == cudaSuccess, "frees");
  void *again = must_malloc(256 * MiB);
  ACCESS(1, again, 256 * MiB, "");
  CHECK(cudaFree(again) == cudaSuccess, "free");
  CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess, "stream");
  disable_peer(1, 0);
  check_faults();
}

static void scenario_bad(void) {
  emu_set_device_count(2);
  set_device(0);
  void *m = must_malloc(MiB);
  ACCESS(1, m, MiB, "");
  enable_peer(1, 0); /* auto: the grant reaches the pool */
  ACCESS(1, m, MiB, "rw");
  set_device(0);
  CHECK(cudaFree(m) == cudaSuccess, "free");
  check_faults();
}

/* ------------------------------------------------------------------ race */

/* One thread allocates and frees on device 0 (every free gives idle handles back, so mappings
 * come and go) while another turns device 1's peer access and pool access on and off. */
enum { RACE_LIVE = 8, RACE_ROUNDS = 300, RACE_TOGGLES = 120 };
static void *g_live[RACE_LIVE];
static size_t g_live_n[RACE_LIVE];
static volatile int g_race_errors;

static size_t race_size(unsigned i) {
  static const size_t sizes[] = {96 * MiB, 256 * KiB, 3 * MiB, 70 * MiB, 40 * KiB, 12 * MiB};
  return sizes[i % (sizeof sizes / sizeof sizes[0])];
}

static void *race_alloc(void *arg) {
  (void)arg;
  if (cudaSetDevice(0) != cudaSuccess) g_race_errors++;
  for (unsigned i = 0; i < RACE_ROUNDS; i++) {
    unsigned k = i % RACE_LIVE;
    if (g_live[k] && cudaFree(g_live[k]) != cudaSuccess) g_race_errors++;
    g_live_n[k] = race_size(i);
    if (cudaMalloc(&g_live[k], g_live_n[k]) != cudaSuccess) {
      g_race_errors++;
      g_live[k] = NULL;
    }
  }
  return NULL;
}

static void *race_toggle(void *arg) {
  (void)arg;
  if (cudaSetDevice(1) != cudaSuccess) g_race_errors++;
  cudaMemPool_t pool = NULL;
  if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess) g_race_errors++;
  for (int i = 0; i < RACE_TOGGLES; i++) {
    if (i % 2 == 0 && cudaDeviceEnablePeerAccess(0, 0) != cudaSuccess) g_race_errors++;
    if (i % 2 == 1 && cudaDeviceDisablePeerAccess(0) != cudaSuccess) g_race_errors++;
    struct cudaMemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = cudaMemLocationTypeDevice;
    d.location.id = 1;
    d.flags = i % 3 == 0 ? cudaMemAccessFlagsProtRead : cudaMemAccessFlagsProtNone;
    if (cudaMemPoolSetAccess(pool, &d, 1) != cudaSuccess) g_race_errors++;
  }
  /* Ends with peer access on and pool access off. */
  if (cudaDeviceEnablePeerAccess(0, 0) != cudaSuccess) g_race_errors++;
  return NULL;
}

static void scenario_race(void) {
  emu_set_device_count(2);
  set_device(0);
  pthread_t a, b;
  CHECK(pthread_create(&a, NULL, race_alloc, NULL) == 0 && pthread_create(&b, NULL, race_toggle, NULL) == 0,
        "threads");
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  CHECK(g_race_errors == 0, "%d calls failed", g_race_errors);
  CHECK(shim_stats().trims > 0, "handles were given back meanwhile");
  for (int k = 0; k < RACE_LIVE; k++)
    if (g_live[k]) ACCESS(1, g_live[k], g_live_n[k], "rw");
  disable_peer(1, 0);
  for (int k = 0; k < RACE_LIVE; k++)
    if (g_live[k]) ACCESS(1, g_live[k], g_live_n[k], "");
  set_device(0);
  for (int k = 0; k < RACE_LIVE; k++) CHECK(!g_live[k] || cudaFree(g_live[k]) == cudaSuccess, "free");
  check_faults(); /* also: no cuMemSetAccess on a range that was unmapped meanwhile */
}

/* ------------------------------------------------------------------ log */

static char g_log[256];

static const char *read_log(void) {
  static char buf[1 << 18];
  check_read_file(g_log, buf, sizeof buf);
  return buf;
}

/* The log's lines from offset `from` on that contain every one of the NULL-terminated needles. */
static int lines_with(size_t from, ...) {
  const char *log = read_log();
  if (from > strlen(log)) return 0;
  int n = 0;
  for (const char *l = log + from; *l;) {
    const char *e = strchr(l, '\n');
    size_t len = e ? (size_t)(e - l) : strlen(l);
    char line[1200];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), l);
    va_list ap;
    va_start(ap, from);
    int all = 1;
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
      if (!strstr(line, s)) all = 0;
    va_end(ap);
    n += all;
    l += len + (e != NULL);
  }
  return n;
}

static void scenario_log(void) {
  snprintf(g_log, sizeof g_log, "/tmp/vmmshim-peer-test.%d.log", (int)getpid()); /* VMMSHIM_LOG's %p */
  emu_set_device_count(3);
  set_device(0);
  void *m = must_malloc(MiB);
  CHECK(lines_with(0, "cuMemSetAccess va 0x", "device 0 access READWRITE (", NULL) >= 1,
        "the first mapping names the owner's access alone");
  CHECK(lines_with(0, "cuMemSetAccess", "device 1", NULL) == 0, "no other device before a grant");
  size_t at = strlen(read_log());
  enable_peer(1, 0);
  CHECK(lines_with(at, "cuMemSetAccess va 0x", "device 0 access READWRITE, device 1 access READWRITE (", NULL) >= 1,
        "peer access: device 1 read-write on the existing mapping");
  CHECK(lines_with(at, "access for peers now read-write 0x2, read 0x0", "peer access enabled", NULL) == 1,
        "the change is named once");
  at = strlen(read_log());
  pool_access(0, 2, cudaMemAccessFlagsProtRead);
  CHECK(lines_with(at, "cuMemSetAccess", "device 0 access READWRITE, device 1 access READWRITE, device 2 access READ (",
                   NULL) >= 1,
        "pool access: device 2 READ next to device 1");
  at = strlen(read_log());
  set_device(0);
  void *big = must_malloc(256 * MiB);
  CHECK(lines_with(at, "cuMemSetAccess", "size 0x10000000", "device 1 access READWRITE, device 2 access READ (", NULL) == 1,
        "a new mapping gets the peers at once, in the same call");
  at = strlen(read_log());
  disable_peer(1, 0);
  pool_access(0, 2, cudaMemAccessFlagsProtNone);
  CHECK(lines_with(at, "cuMemSetAccess", "device 0 access READWRITE, device 1 access NONE, device 2 access READ (", NULL) >= 2,
        "disable: device 1 NONE on both mappings");
  CHECK(lines_with(at, "cuMemSetAccess", "device 0 access READWRITE, device 2 access NONE (", NULL) >= 2,
        "pool NONE: device 2 NONE");
  CHECK(lines_with(at, "taken from the others", NULL) == 2, "the withdrawals are named");
  ACCESS(1, big, 256 * MiB, "");
  ACCESS(2, big, 256 * MiB, "");
  set_device(0);
  CHECK(cudaFree(m) == cudaSuccess && cudaFree(big) == cudaSuccess, "frees");
  check_faults();
  if (check_failed) printf("log %s:\n%s\n", g_log, read_log());
  unlink(g_log);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(120);
    if (!strcmp(sc, "auto")) scenario_auto();
    else if (!strcmp(sc, "early")) scenario_early();
    else if (!strcmp(sc, "reset")) scenario_reset();
    else if (!strcmp(sc, "all")) scenario_all();
    else if (!strcmp(sc, "none")) scenario_none();
    else if (!strcmp(sc, "bad")) scenario_bad();
    else if (!strcmp(sc, "log")) scenario_log();
    else if (!strcmp(sc, "race")) scenario_race();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  check_run_child("auto", NULL);
  check_run_child("early", NULL);
  check_run_child("reset", NULL);
  check_run_child("all", "VMMSHIM_PEER_ACCESS=all", "VMMSHIM_VERBOSE=1", NULL);
  CHECK(strstr(check_child_output, "option VMMSHIM_PEER_ACCESS = all\n") != NULL, "VMMSHIM_VERBOSE shows the mode");
  check_run_child("none", "VMMSHIM_PEER_ACCESS=none", NULL);
  check_run_child("bad", "VMMSHIM_PEER_ACCESS=sometimes", NULL);
  CHECK(strstr(check_child_output,
               "VMMSHIM_PEER_ACCESS='sometimes' is not valid (expected auto, all or none); using the default auto") != NULL,
        "no message naming VMMSHIM_PEER_ACCESS, its value and the choices");
  check_run_child("log", "VMMSHIM_LOG=info:/tmp/vmmshim-peer-test.%p.log", NULL);
  check_run_child("race", "VMMSHIM_RELEASE_THRESHOLD=0", NULL);
  return check_summary();
}
