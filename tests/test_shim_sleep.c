/* test_shim_sleep: tags, sleep and wake, on the emulation (one process per scenario: the shim
 * reads its options once).
 *
 * The emulated device memory is a memfd per handle, mapped at the device address; the test
 * reads and writes blocks through those addresses as a kernel would, and asks the emulation what
 * is mapped where (emu_host_mapped: -1 unmapped, 0 a device handle, 1 a host-location handle)
 * and how much device and host memory is in use.
 *
 *   modes    weights (cudaMalloc) and kv (cudaMallocAsync on two streams) in their own tags;
 *            work still queued on a stream when the sleep starts completes first; discard gives
 *            the device memory back and wakes to zeros with VMMSHIM_WAKE_ZERO; host keeps the
 *            bytes in host memory and restores them at the same addresses; mapped serves them
 *            from host memory at the same addresses while asleep (reads and writes reach them,
 *            pointer queries still answer device memory) and keeps what was written; asleep and
 *            awake answers; per-tag figures at every step.
 *   isolate  eight threads allocate in four tags, interleaved: sleeping one tag unmaps every
 *            block of it and no block of the others (no handle holds two tags).
 *   during   frees of sleeping blocks are taken (nothing released twice), allocations in a
 *            sleeping tag are served from new device memory and stay awake, a second sleep
 *            takes them; the woken pools serve allocations again.
 *   nowake   the device has no room at the wake (cuMemCreate fails): -ENOMEM, nothing lost,
 *            still asleep, counted as skipped; the next wake restores every byte.
 *   capture  a capture in progress: the sleep waits VMMSHIM_SLEEP_WAIT ms and refuses (-EBUSY)
 *            without invalidating the capture; after it ends, the sleep goes through.
 *   gate     a launch submitted while memory moves waits until the move is done.
 *   cycles   300 sleep/wake cycles in host mode: handles, mappings, reservations, host memory,
 *            descriptors do not grow; host memory is reused (no host handle made after the
 *            first cycle).
 *   levels   level 2 discards every tag but the one marked keep (copied to host); level 1 with
 *            mapped keeps every tag usable; level 0 gives back idle memory only.
 *   process  VMMSHIM_TAG=weights: allocations start in weights; vmmshim_set_process_tag moves
 *            threads without a tag of their own, vmmshim_set_tag one thread; bad names refused.
 *   limit    VMMSHIM_HOST_LIMIT smaller than the tag: what does not fit stays on the device,
 *            the answer says so.
 *   peers    two devices, device 1 granted access by peer access: after a wake, device 1 reads
 *            the woken bytes (access given again).
 *   nohost   a device without host-location VMM: host and mapped modes leave everything on the
 *            device with the reason; discard works.
 *   skipsum  two devices without host-location VMM, a tag on each (two segments on device 1): a
 *            mapped sleep skips every byte and the answer's skipped is their sum over the pools
 *            and segments; a discard skips nothing.
 *   ipc      a block another process holds open through CUDA IPC stays on the device (the answer
 *            says why), the rest of the tag sleeps; once the importer closed it, it sleeps too.
 *   big      a block on one 150 MiB handle (three host buffers of 64 MiB and one of the rest):
 *            mapped and host cycles keep every byte.
 *   merge    four neighbouring blocks on handles of their own: a wake in each mode maps them with
 *            handles of at most VMMSHIM_WAKE_MERGE (default 1 GiB, no more than
 *            VMMSHIM_MAX_HANDLE): 1, 2 or 4 handles as set, bytes intact (zeros in discard
 *            mode); a failed device mapping leaves that handle's blocks asleep on host memory,
 *            intact, and the next wake brings them back; freed and trimmed, nothing stays.
 *   copyfail (VMMSHIM_WAKE_MERGE=0) three blocks on handles of their own; a copy to the host that cannot be queued, or
 *            a wait for copies that fails, part-way through a mapped sleep: the blocks before it
 *            sleep, it and the later ones stay on the device, every byte intact, the answer
 *            says why (and the sleep returns 0, as any sleep that moved what it could); events that cannot be made: the sleep waits for whole streams and
 *            completes. At the wake, a copy back that fails or a device mapping that fails
 *            leaves the blocks asleep, served from host memory, intact; the next wake brings
 *            every byte back.
 *   alias    (VMMSHIM_WAKE_MERGE=0) mapped mode copies from an alias of the segments, reserved
 *            and given back by each sleep; without one (reserve or map fails) everything still
 *            sleeps; an unmap that fails keeps its block on the device, a host mapping that
 *            fails keeps its bytes on the host, a failed wait maps the device memory back, and
 *            when that fails too the block is discarded (said, wakes to zeros).
 *   untagged memory allocated with no tag set is "untagged": a sleep of "default" (a region's
 *            tag) leaves it on the device, intact; naming "untagged" sleeps it alone.
 *            vmmshim_host_copy finds a host-mode sleeping block's bytes (at any offset), and
 *            answers ENOENT for awake memory.
 *   view     vmmshim_host_view: a host-mode sleeping block's bytes (written by the device before
 *            the sleep) read in place at the CPU address it answers, which is the host buffer's
 *            own (vmmshim_host_copy's home, host memory, the CPU given READWRITE with a
 *            HOST_NUMA descriptor), also in mapped mode and at an offset; a write there is what
 *            the wake restores; ENOENT awake, EXDEV for a range over two 64 MiB buffers, for
 *            discarded memory and for memory on disk, EINVAL for size 0 or no out pointer.
 *   viewoff  the driver refuses CPU access to host memory: sleeps and wakes work as before, the
 *            bytes are still found by vmmshim_host_copy, vmmshim_host_view answers ENOTSUP.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sys/wait.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

/* The shim's API, found at run time in the preloaded library (the program does not link it). */
#pragma weak vmmshim_sleep
#pragma weak vmmshim_wake
#pragma weak vmmshim_sleep_level
#pragma weak vmmshim_set_tag
#pragma weak vmmshim_set_process_tag
#pragma weak vmmshim_get_tag
#pragma weak vmmshim_set_tag_keep
#pragma weak vmmshim_tag_stats
#pragma weak vmmshim_host_memory
#pragma weak vmmshim_release_host
#pragma weak vmmshim_api_version
#pragma weak vmmshim_trim
#pragma weak vmmshim_host_copy
#pragma weak vmmshim_host_view
#pragma weak vmmshim_set_disk_dir

static vmmshim_sleep_result_t g_res;
static const char *g_self;

static int do_sleep(const char *tag, vmmshim_sleep_mode_t mode) {
  memset(&g_res, 0, sizeof g_res);
  return vmmshim_sleep(tag, mode, &g_res, sizeof g_res);
}
static int do_wake(const char *tag, unsigned flags) {
  memset(&g_res, 0, sizeof g_res);
  return vmmshim_wake(tag, flags, &g_res, sizeof g_res);
}

static void *tagged_malloc(const char *tag, size_t n) {
  CHECK(vmmshim_set_tag(tag) == 0, "set tag %s", tag);
  void *p = must_malloc(n);
  vmmshim_set_tag(NULL);
  return p;
}

/* Every byte of the range mapped to a handle of this kind (0 device, 1 host, -1 unmapped). */
static int mapped_as(const void *p, size_t n) {
  int kind = emu_host_mapped((CUdeviceptr)(uintptr_t)p);
  for (size_t off = 0; off < n; off += 2 * MiB)
    if (emu_host_mapped((CUdeviceptr)(uintptr_t)p + off) != kind) return -2;
  return kind;
}

static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

/* A kernel still running when the sleep starts: it writes its block when it completes. */
static void late_kernel(void *arg) { memset(arg, 0x5a, 4096); }

static void scenario_modes(void) {
  size_t wn = 48 * MiB, kn = 40 * MiB;
  char *w = tagged_malloc("weights", wn);
  CHECK(vmmshim_set_tag("kv") == 0, "set tag kv");
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreate(&s1) == cudaSuccess && cudaStreamCreate(&s2) == cudaSuccess, "streams");
  char *k1 = NULL, *k2 = NULL;
  CHECK(cudaMallocAsync((void **)&k1, kn, s1) == cudaSuccess && k1, "kv async 1");
  CHECK(cudaMallocAsync((void **)&k2, kn, s2) == cudaSuccess && k2, "kv async 2");
  vmmshim_set_tag(NULL);
  if (!w || !k1 || !k2) return;
  cudaStreamSynchronize(s1);
  cudaStreamSynchronize(s2);
  pat_fill_sparse(w, wn, 1);
  pat_fill_sparse(k1, kn, 2);
  pat_fill_sparse(k2, kn, 3);
  vmmshim_tag_stats_t ts = shim_tag_stats("weights");
  CHECK(ts.live >= wn && ts.device >= wn && !ts.asleep, "weights before: live %llu device %llu",
        (unsigned long long)ts.live, (unsigned long long)ts.device);

  /* discard kv, with a kernel still queued on its stream that writes k1: it runs first. */
  emu_launch(s1, late_kernel, k1 + kn - 4096);
  size_t dev_before = emu_device_used(0);
  CHECK(do_sleep("kv", VMMSHIM_SLEEP_DISCARD) == 0, "sleep kv discard: %d %s", g_res.error, g_res.reason);
  CHECK(emu_pending(s1) == 0, "the queued kernel ran before the sleep");
  CHECK(g_res.released >= 2 * kn && g_res.discarded >= 2 * kn && g_res.to_host == 0, "released %llu discarded %llu",
        (unsigned long long)g_res.released, (unsigned long long)g_res.discarded);
  CHECK(dev_before - emu_device_used(0) >= 2 * kn, "device memory given back: %zu -> %zu", dev_before,
        emu_device_used(0));
  CHECK(mapped_as(k1, kn) == -1 && mapped_as(k2, kn) == -1, "kv unmapped while asleep");
  CHECK(mapped_as(w, wn) == 0, "weights untouched");
  ts = shim_tag_stats("kv");
  CHECK(ts.asleep && ts.discarded >= 2 * kn && ts.device == 0, "kv stats asleep: discarded %llu device %llu",
        (unsigned long long)ts.discarded, (unsigned long long)ts.device);
  CHECK(do_sleep("kv", VMMSHIM_SLEEP_DISCARD) == -EALREADY, "sleeping a sleeping tag: %d", g_res.error);

  /* host weights */
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_HOST) == 0, "sleep weights host: %s", g_res.reason);
  CHECK(g_res.to_host >= wn && g_res.released >= wn, "weights to host %llu", (unsigned long long)g_res.to_host);
  CHECK(mapped_as(w, wn) == -1, "weights unmapped while asleep");
  CHECK(emu_host_used() >= wn, "host memory holds them: %zu", emu_host_used());
  uint64_t in_use = 0, cached = 0;
  vmmshim_host_memory(&in_use, &cached);
  CHECK(in_use >= wn, "host in use %llu", (unsigned long long)in_use);

  /* wake both: same addresses, bytes back */
  CHECK(do_wake("weights", 0) == 0, "wake weights: %s", g_res.reason);
  CHECK(g_res.restored >= wn, "restored %llu", (unsigned long long)g_res.restored);
  CHECK(mapped_as(w, wn) == 0, "weights mapped on the device again");
  CHECK(pat_check_sparse(w, wn, 1) == (size_t)-1, "weights intact after host sleep");
  vmmshim_host_memory(&in_use, &cached);
  CHECK(in_use == 0 && cached >= wn, "host buffers kept for the next sleep: in use %llu cached %llu",
        (unsigned long long)in_use, (unsigned long long)cached);
  CHECK(do_wake("weights", 0) == -EALREADY, "waking an awake tag: %d", g_res.error);
  CHECK(do_wake("kv", VMMSHIM_WAKE_ZERO) == 0, "wake kv zero: %s", g_res.reason);
  CHECK(mapped_as(k1, kn) == 0, "kv mapped again");
  int zeros = 1;
  for (size_t i = 0; i < kn; i += 4096) zeros &= k1[i] == 0 && k2[i] == 0;
  CHECK(zeros, "discarded kv wakes as zeros");
  ts = shim_tag_stats("kv");
  CHECK(!ts.asleep && ts.device >= 2 * kn, "kv awake");

  /* mapped: the program keeps using the memory */
  pat_fill_sparse(w, wn, 4);
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_MAPPED) == 0, "sleep weights mapped: %s", g_res.reason);
  CHECK(g_res.host_mapped >= wn, "host mapped %llu", (unsigned long long)g_res.host_mapped);
  CHECK(mapped_as(w, wn) == 1, "weights served from host memory at the same address");
  CHECK(pat_check_sparse(w, wn, 4) == (size_t)-1, "weights readable while asleep in mapped mode");
  CUmemorytype mt = 0;
  CHECK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)w) == CUDA_SUCCESS &&
            mt == CU_MEMORYTYPE_DEVICE,
        "pointer query answers device memory (%d)", (int)mt);
  struct cudaPointerAttributes pa;
  CHECK(cudaPointerGetAttributes(&pa, w) == cudaSuccess && pa.type == cudaMemoryTypeDevice,
        "cudaPointerGetAttributes answers device (%d)", (int)pa.type);
  pat_fill_sparse(w, wn, 5); /* written while asleep */
  ts = shim_tag_stats("weights");
  CHECK(ts.host_mapped >= wn && ts.asleep, "weights stats mapped %llu", (unsigned long long)ts.host_mapped);
  CHECK(emu_device_access(0, (CUdeviceptr)(uintptr_t)w, 4096, 1) == 0, "the device may still write it");
  long long syncs = emu_calls("cuCtxSynchronize");
  CHECK(do_wake(NULL, 0) == 0, "wake every tag: %s", g_res.reason);
  CHECK(emu_calls("cuCtxSynchronize") > syncs,
        "the wake waited for the GPU work submitted before it (it may run on the host-mapped memory)");
  CHECK(mapped_as(w, wn) == 0, "weights back on the device");
  CHECK(pat_check_sparse(w, wn, 5) == (size_t)-1, "what was written while asleep is kept");
  CHECK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)w) == CUDA_SUCCESS &&
            mt == CU_MEMORYTYPE_DEVICE,
        "device after the wake");

  CHECK(cudaFree(w) == cudaSuccess && cudaFreeAsync(k1, s1) == cudaSuccess && cudaFreeAsync(k2, s2) == cudaSuccess,
        "frees");
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  CHECK(vmmshim_sleep("nosuchtag", VMMSHIM_SLEEP_HOST, NULL, 0) == -ENOENT, "unknown tag");
  CHECK(vmmshim_sleep("weights", (vmmshim_sleep_mode_t)7, NULL, 0) == -EINVAL, "bad mode");
  CHECK(vmmshim_sleep("weights", VMMSHIM_SLEEP_HOST, &g_res, 3) == -EINVAL, "bad result size");
}

#define ISO_THREADS 8
#define ISO_PER 24
static const char *const iso_tags[4] = {"t0", "t1", "t2", "t3"};
static void *iso_ptr[ISO_THREADS][ISO_PER];
static size_t iso_len[ISO_THREADS][ISO_PER];

static void *iso_thread(void *arg) {
  int id = (int)(intptr_t)arg;
  unsigned long long seed = (unsigned long long)id * 7 + 1;
  cudaSetDevice(0);
  for (int i = 0; i < ISO_PER; i++) {
    vmmshim_set_tag(iso_tags[(id + i) % 4]);
    size_t n = rnd_size(&seed, 6 * MiB);
    if (cudaMalloc(&iso_ptr[id][i], n) != cudaSuccess) iso_ptr[id][i] = NULL;
    iso_len[id][i] = n;
  }
  return NULL;
}

static void scenario_isolate(void) {
  pthread_t t[ISO_THREADS];
  for (int i = 0; i < ISO_THREADS; i++) pthread_create(&t[i], NULL, iso_thread, (void *)(intptr_t)i);
  for (int i = 0; i < ISO_THREADS; i++) pthread_join(t[i], NULL);
  for (int victim = 0; victim < 4; victim++) {
    CHECK(do_sleep(iso_tags[victim], VMMSHIM_SLEEP_DISCARD) == 0, "sleep %s: %s", iso_tags[victim], g_res.reason);
    int wrong = 0, missing = 0;
    for (int th = 0; th < ISO_THREADS; th++)
      for (int i = 0; i < ISO_PER; i++) {
        if (!iso_ptr[th][i]) {
          missing++;
          continue;
        }
        int tag = (th + i) % 4, kind = mapped_as(iso_ptr[th][i], iso_len[th][i]);
        if ((tag == victim) != (kind == -1)) wrong++;
      }
    CHECK(!wrong && !missing, "sleeping %s unmapped exactly its blocks (%d wrong, %d missing)", iso_tags[victim], wrong,
          missing);
    CHECK(do_wake(iso_tags[victim], 0) == 0, "wake %s", iso_tags[victim]);
  }
  for (int th = 0; th < ISO_THREADS; th++)
    for (int i = 0; i < ISO_PER; i++) cudaFree(iso_ptr[th][i]);
}

static void scenario_during(void) {
  char *a = tagged_malloc("kv", 8 * MiB), *b = tagged_malloc("kv", 8 * MiB);
  if (!a || !b) return;
  pat_fill_sparse(b, 8 * MiB, 9);
  CHECK(do_sleep("kv", VMMSHIM_SLEEP_HOST) == 0, "sleep: %s", g_res.reason);
  emu_counters_t before = emu_now();
  CHECK(cudaFree(a) == cudaSuccess, "free of a sleeping block");
  CHECK(cudaFree(a) != cudaSuccess, "freed twice: refused");
  emu_counters_t after = emu_now();
  CHECK(after.n_cuMemRelease == before.n_cuMemRelease, "nothing released by the free");
  char *c = tagged_malloc("kv", 4 * MiB); /* a sleeping tag still allocates */
  if (c) {
    CHECK(mapped_as(c, 4 * MiB) == 0, "served from new device memory");
    memset(c, 7, 4 * MiB);
  }
  vmmshim_tag_stats_t ts = shim_tag_stats("kv");
  CHECK(ts.asleep && ts.device >= 4 * MiB, "part asleep, part awake: device %llu", (unsigned long long)ts.device);
  CHECK(do_sleep("kv", VMMSHIM_SLEEP_HOST) == 0, "the second sleep takes the new memory: %s", g_res.reason);
  if (c) CHECK(mapped_as(c, 4 * MiB) == -1, "new block asleep too");
  CHECK(do_wake("kv", 0) == 0, "wake: %s", g_res.reason);
  CHECK(pat_check_sparse(b, 8 * MiB, 9) == (size_t)-1, "b intact");
  if (c) CHECK(c[0] == 7 && c[4 * MiB - 1] == 7, "c intact");
  char *d = tagged_malloc("kv", 8 * MiB); /* the woken pool serves again */
  CHECK(d && mapped_as(d, 8 * MiB) == 0, "allocation after the wake");
  cudaFree(b), cudaFree(c), cudaFree(d);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

static void scenario_nowake(void) {
  size_t n = 24 * MiB;
  char *w = tagged_malloc("weights", n);
  if (!w) return;
  pat_fill_sparse(w, n, 11);
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_HOST) == 0, "sleep: %s", g_res.reason);
  emu_fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 1);
  CHECK(do_wake("weights", 0) == -ENOMEM, "no room: -ENOMEM (%d) %s", g_res.error, g_res.reason);
  CHECK(strstr(g_res.reason, "no room") != NULL, "the reason says so: %s", g_res.reason);
  CHECK(g_res.skipped >= n && g_res.restored == 0, "the answer counts what is still asleep: skipped %llu, restored %llu",
        (unsigned long long)g_res.skipped, (unsigned long long)g_res.restored);
  CHECK(mapped_as(w, n) == -1 && shim_tag_stats("weights").asleep, "still asleep");
  CHECK(do_wake("weights", 0) == 0, "the next wake: %s", g_res.reason);
  CHECK(pat_check_sparse(w, n, 11) == (size_t)-1, "nothing lost");
  /* A mapped sleep whose wake fails keeps serving from host memory. */
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_MAPPED) == 0, "sleep mapped: %s", g_res.reason);
  emu_fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 1);
  CHECK(do_wake("weights", 0) == -ENOMEM, "mapped: no room");
  CHECK(mapped_as(w, n) == 1 && pat_check_sparse(w, n, 11) == (size_t)-1, "still usable from host memory");
  CHECK(do_wake("weights", 0) == 0, "then wakes");
  CHECK(pat_check_sparse(w, n, 11) == (size_t)-1 && mapped_as(w, n) == 0, "intact, on the device");
  cudaFree(w);
}

static void scenario_capture(void) {
  char *w = tagged_malloc("weights", 4 * MiB);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  double t0 = now_s();
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_HOST) == -EBUSY, "refused during a capture (%d)", g_res.error);
  double waited = now_s() - t0;
  CHECK(waited >= 0.15 && waited < 5, "waited VMMSHIM_SLEEP_WAIT first: %.3f s", waited);
  CHECK(strstr(g_res.reason, "capture") != NULL, "the reason names the capture: %s", g_res.reason);
  CHECK(w && mapped_as(w, 4 * MiB) == 0, "nothing moved");
  cudaGraph_t g = NULL;
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess, "the capture is still valid");
  if (g) cudaGraphDestroy(g);
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_HOST) == 0, "after the capture: %s", g_res.reason);
  /* A wake during a capture does not synchronise (that would invalidate the capture). */
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin another capture");
  CHECK(do_wake("weights", 0) == 0, "wake during the capture: %s", g_res.reason);
  g = NULL;
  CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess, "the capture is still valid after the wake");
  if (g) cudaGraphDestroy(g);
  cudaFree(w);
  cudaStreamDestroy(s);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

static volatile double g_launch_done;
/* Submits work once the move has begun: a kernel launch (arg NULL), or a 2D memset of four rows
 * of 1 KiB at a pitch of 4 KiB into arg. */
static void *launcher(void *arg) {
  cudaSetDevice(0);
  sleep_ms(100); /* the move has begun */
  CUresult r = arg ? cuMemsetD2D8Async((CUdeviceptr)(uintptr_t)arg, 4096, 0x7f, 1024, 4, NULL)
                   : cuLaunchKernel((CUfunction)(uintptr_t)0x1234, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
  g_launch_done = now_s();
  CHECK(r == CUDA_SUCCESS, "%s: %d", arg ? "2D memset" : "launch", (int)r);
  return NULL;
}

static void scenario_gate(void) {
  char *w = tagged_malloc("weights", 8 * MiB);
  if (!w) return;
  CHECK(in_shim((void *)cuLaunchKernel), "cuLaunchKernel is the shim's");
  emu_delay_next("cuMemUnmap", 400000, 1); /* the move takes 0.4 s */
  pthread_t t;
  pthread_create(&t, NULL, launcher, NULL);
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_DISCARD) == 0, "sleep: %s", g_res.reason);
  double sleep_done = now_s();
  pthread_join(t, NULL);
  CHECK(g_launch_done >= sleep_done - 0.001, "the launch waited for the move (%.3f s after it)", g_launch_done - sleep_done);
  double t0 = now_s();
  /* (a gate left closed holds for good: a bound well above a stall under load still sees it) */
  CHECK(cuLaunchKernel((CUfunction)(uintptr_t)0x1234, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS &&
            now_s() - t0 < 1.0,
        "an open gate does not hold");
  CHECK(do_wake("weights", 0) == 0, "wake");

  /* A 2D memset (cudaMemset2D's entry point) is held the same way. */
  char *o = tagged_malloc("other", 64 * 1024);
  if (!o) return;
  memset(o, 0, 64 * 1024);
  CHECK(in_shim((void *)cuMemsetD2D8Async) && in_shim((void *)cuMemsetD2D8), "the 2D memsets are the shim's");
  emu_delay_next("cuMemUnmap", 400000, 1);
  pthread_create(&t, NULL, launcher, o);
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_DISCARD) == 0, "sleep: %s", g_res.reason);
  sleep_done = now_s();
  pthread_join(t, NULL);
  CHECK(g_launch_done >= sleep_done - 0.001, "the 2D memset waited for the move (%.3f s after it)", g_launch_done - sleep_done);
  cudaDeviceSynchronize();
  CHECK(o[0] == 0x7f && o[3 * 4096 + 1023] == 0x7f && o[1024] == 0 && o[4 * 4096] == 0, "four rows set, the pitch's gaps not");
  CHECK(do_wake("weights", 0) == 0, "wake");
  cudaFree(o);
  cudaFree(w);
}

static void scenario_cycles(void) {
  size_t n = 40 * MiB;
  char *w = tagged_malloc("weights", n), *k = tagged_malloc("kv", 20 * MiB);
  if (!w || !k) return;
  pat_fill_sparse(w, n, 21);
  emu_counters_t c0 = {0};
  int fds0 = 0;
  size_t host0 = 0;
  int bad = 0;
  for (int i = 0; i < 300; i++) {
    if (do_sleep("weights", VMMSHIM_SLEEP_HOST) || do_sleep("kv", VMMSHIM_SLEEP_DISCARD)) bad++;
    if (do_wake(NULL, 0)) bad++;
    if (i == 1) { /* from the second cycle on, nothing may grow */
      c0 = emu_now();
      fds0 = open_fds();
      host0 = emu_host_used();
    }
  }
  emu_counters_t c1 = emu_now();
  CHECK(!bad, "%d cycles failed", bad);
  CHECK(pat_check_sparse(w, n, 21) == (size_t)-1, "weights intact after 300 cycles");
  CHECK(c1.live_handles <= c0.live_handles && c1.live_mappings <= c0.live_mappings &&
            c1.live_reservations <= c0.live_reservations,
        "handles %ld -> %ld, mappings %ld -> %ld, reservations %ld -> %ld", c0.live_handles, c1.live_handles,
        c0.live_mappings, c1.live_mappings, c0.live_reservations, c1.live_reservations);
  CHECK(emu_host_used() <= host0, "host memory %zu -> %zu", host0, emu_host_used());
  CHECK(open_fds() <= fds0, "descriptors %d -> %d", fds0, open_fds());
  CHECK(vmmshim_release_host(0) >= n, "the kept host memory goes back on request");
  CHECK(emu_host_used() == 0, "none left: %zu", emu_host_used());
  cudaFree(w), cudaFree(k);
}

static void scenario_levels(void) {
  char *w = tagged_malloc("weights", 16 * MiB), *k = tagged_malloc("kv", 16 * MiB), *d = must_malloc(8 * MiB);
  if (!w || !k || !d) return;
  pat_fill_sparse(w, 16 * MiB, 31);
  pat_fill_sparse(d, 8 * MiB, 32);
  CHECK(vmmshim_set_tag_keep("weights", 1) == 0, "keep weights");
  CHECK(vmmshim_sleep_level(2, 0, &g_res, sizeof g_res) == 0, "level 2: %s", g_res.reason);
  CHECK(shim_tag_stats("weights").host_copied >= 16 * MiB && shim_tag_stats("kv").discarded >= 16 * MiB &&
            shim_tag_stats("untagged").discarded >= 8 * MiB,
        "level 2: weights kept on the host, kv and untagged discarded");
  CHECK(do_wake(NULL, 0) == 0, "wake all");
  CHECK(pat_check_sparse(w, 16 * MiB, 31) == (size_t)-1, "weights intact");
  CHECK(vmmshim_sleep_level(1, 1, &g_res, sizeof g_res) == 0, "level 1 mapped: %s", g_res.reason);
  CHECK(mapped_as(w, 16 * MiB) == 1 && mapped_as(d, 8 * MiB) == 1, "everything served from host memory");
  CHECK(pat_check_sparse(d, 8 * MiB, 32) != (size_t)-1 || 1, "untagged was discarded at level 2 (any bytes)");
  pat_fill_sparse(d, 8 * MiB, 33);
  CHECK(do_wake(NULL, 0) == 0, "wake all");
  CHECK(pat_check_sparse(d, 8 * MiB, 33) == (size_t)-1 && pat_check_sparse(w, 16 * MiB, 31) == (size_t)-1,
        "level 1 mapped kept every byte");
  cudaFree(d);
  void *idle = tagged_malloc("kv", 64 * MiB);
  cudaFree(idle);
  CHECK(vmmshim_sleep_level(0, 0, &g_res, sizeof g_res) == 0 && g_res.released >= 64 * MiB,
        "level 0 gives back idle memory: %llu", (unsigned long long)g_res.released);
  CHECK(mapped_as(w, 16 * MiB) == 0 && mapped_as(k, 16 * MiB) == 0, "level 0 moves nothing live");
  CHECK(vmmshim_sleep_level(3, 0, NULL, 0) == -EINVAL, "level 3 refused");
  cudaFree(w), cudaFree(k);
}

static void scenario_process(void) {
  char buf[VMMSHIM_TAG_MAX];
  CHECK(vmmshim_get_tag(buf, sizeof buf) == 0 && !strcmp(buf, "weights"), "VMMSHIM_TAG=weights: %s", buf);
  void *a = must_malloc(4 * MiB);
  CHECK(shim_tag_stats("weights").live >= 4 * MiB, "allocated in weights");
  CHECK(vmmshim_set_process_tag("kv") == 0, "process tag kv");
  void *b = must_malloc(4 * MiB);
  CHECK(shim_tag_stats("kv").live >= 4 * MiB, "then in kv");
  CHECK(vmmshim_set_tag("mine") == 0 && vmmshim_get_tag(buf, sizeof buf) == 0 && !strcmp(buf, "mine"), "thread tag");
  void *c = must_malloc(4 * MiB);
  CHECK(shim_tag_stats("mine").live >= 4 * MiB && shim_tag_stats("kv").live < 8 * MiB, "the thread's own tag wins");
  vmmshim_set_tag(NULL);
  CHECK(vmmshim_set_tag("bad name") == -EINVAL && vmmshim_set_tag("") == -EINVAL &&
            vmmshim_set_tag("0123456789012345678901234567890123") == -EINVAL,
        "bad names refused");
  char small[2]; /* "kv" needs 3 bytes */
  CHECK(vmmshim_get_tag(small, sizeof small) == -EINVAL, "a buffer too small is refused");
  int made = 0;
  for (int i = 0; i < 40; i++) {
    char name[16];
    snprintf(name, sizeof name, "x%d", i);
    made += vmmshim_set_tag(name) == 0;
  }
  vmmshim_set_tag(NULL);
  CHECK(made == VMMSHIM_MAX_TAGS - 4, "at most %d tags (%d made)", VMMSHIM_MAX_TAGS, made);
  cudaFree(a), cudaFree(b), cudaFree(c);
}

static void scenario_limit(void) {
  enum { N = 6 };
  char *w[N];
  for (int i = 0; i < N; i++) {
    w[i] = tagged_malloc("weights", 60 * MiB); /* a 64 MiB handle each */
    if (!w[i]) return;
    pat_fill_sparse(w[i], 60 * MiB, 41 + (unsigned)i);
  }
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_HOST) == 0, "sleep: %s", g_res.reason);
  CHECK(g_res.skipped > 0 && g_res.to_host > 0 && g_res.to_host <= 128 * MiB, "to host %llu, skipped %llu",
        (unsigned long long)g_res.to_host, (unsigned long long)g_res.skipped);
  CHECK(strstr(g_res.reason, "VMMSHIM_HOST_LIMIT") != NULL, "reason: %s", g_res.reason);
  CHECK(emu_host_used() <= 128 * MiB, "host memory under the limit: %zu", emu_host_used());
  int asleep = 0;
  for (int i = 0; i < N; i++) asleep += mapped_as(w[i], 60 * MiB) == -1;
  CHECK(asleep >= 1 && asleep < N, "%d of %d blocks asleep", asleep, N);
  CHECK(do_wake("weights", 0) == 0, "wake: %s", g_res.reason);
  for (int i = 0; i < N; i++) {
    CHECK(pat_check_sparse(w[i], 60 * MiB, 41 + (unsigned)i) == (size_t)-1, "block %d intact", i);
    cudaFree(w[i]);
  }
}

static void scenario_peers(void) {
  cudaSetDevice(0);
  char *w = tagged_malloc("weights", 8 * MiB);
  if (!w) return;
  cudaSetDevice(1);
  CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaSuccess, "device 1 gets peer access to device 0");
  cudaSetDevice(0);
  CHECK(emu_device_access(1, (CUdeviceptr)(uintptr_t)w, 4096, 0) == 0, "device 1 reads before");
  pat_fill_sparse(w, 8 * MiB, 51);
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_HOST) == 0, "sleep: %s", g_res.reason);
  CHECK(do_wake("weights", 0) == 0, "wake: %s", g_res.reason);
  CHECK(emu_device_access(1, (CUdeviceptr)(uintptr_t)w, 8 * MiB, 1) == 0, "device 1 reads and writes after the wake");
  CHECK(pat_check_sparse(w, 8 * MiB, 51) == (size_t)-1, "intact");
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_MAPPED) == 0, "sleep mapped");
  CHECK(emu_device_access(1, (CUdeviceptr)(uintptr_t)w, 8 * MiB, 0) == 0, "device 1 reads the host-mapped memory");
  CHECK(do_wake("weights", 0) == 0, "wake");
  cudaFree(w);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

static void scenario_nohost(void) {
  char *w = tagged_malloc("weights", 8 * MiB);
  if (!w) return;
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_MAPPED) == 0 && g_res.skipped >= 8 * MiB && g_res.released == 0,
        "mapped: nothing moves (skipped %llu, released %llu)", (unsigned long long)g_res.skipped,
        (unsigned long long)g_res.released);
  CHECK(strstr(g_res.reason, "host memory") != NULL, "the reason: %s", g_res.reason);
  CHECK(mapped_as(w, 8 * MiB) == 0, "still on the device");
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_DISCARD) == 0 && mapped_as(w, 8 * MiB) == -1, "discard works");
  CHECK(do_wake("weights", 0) == 0, "wake");
  cudaFree(w);
}

/* Two devices without host-location VMM, a tag on each: a mapped sleep leaves every byte of both
 * pools on the device, and the answer's skipped counts both (the sum over the pools, not the
 * last pool's); a discard then moves both and skips nothing. */
static void scenario_skipsum(void) {
  cudaSetDevice(0);
  char *a = tagged_malloc("weights", 8 * MiB);
  cudaSetDevice(1);
  char *b = tagged_malloc("weights", 40 * MiB), *c = tagged_malloc("weights", 100 * MiB); /* two segments */
  cudaSetDevice(0);
  if (!a || !b || !c) return;
  vmmshim_tag_stats_t t = shim_tag_stats("weights");
  CHECK(t.device >= 148 * MiB, "the tag maps both blocks: %llu", (unsigned long long)t.device);
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_MAPPED) == 0, "sleep: %s", g_res.reason);
  CHECK(g_res.skipped == t.device && g_res.released == 0,
        "both pools skipped: %llu of %llu bytes (released %llu)", (unsigned long long)g_res.skipped,
        (unsigned long long)t.device, (unsigned long long)g_res.released);
  CHECK(mapped_as(a, 8 * MiB) == 0 && mapped_as(b, 40 * MiB) == 0 && mapped_as(c, 100 * MiB) == 0,
        "all still on their devices");
  CHECK(do_sleep("weights", VMMSHIM_SLEEP_DISCARD) == 0 && g_res.skipped == 0 && g_res.discarded == t.device,
        "discard: skipped %llu, discarded %llu of %llu", (unsigned long long)g_res.skipped,
        (unsigned long long)g_res.discarded, (unsigned long long)t.device);
  CHECK(do_wake("weights", 0) == 0, "wake: %s", g_res.reason);
  cudaFree(a);
  cudaSetDevice(1);
  cudaFree(b), cudaFree(c);
  cudaSetDevice(0);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

/* A block on one handle larger than a host buffer: its bytes span several buffers. */
static void scenario_big(void) {
  size_t n = 150 * MiB;
  char *b = tagged_malloc("big", n);
  if (!b) return;
  pat_fill_sparse(b, n, 61);
  CHECK(do_sleep("big", VMMSHIM_SLEEP_MAPPED) == 0, "sleep mapped: %s", g_res.reason);
  CHECK(mapped_as(b, n) == 1 && pat_check_sparse(b, n, 61) == (size_t)-1, "served from host buffers, intact");
  pat_fill_sparse(b, n, 62);
  CHECK(do_wake("big", 0) == 0, "wake: %s", g_res.reason);
  CHECK(mapped_as(b, n) == 0 && pat_check_sparse(b, n, 62) == (size_t)-1, "on the device, with what was written");
  CHECK(do_sleep("big", VMMSHIM_SLEEP_HOST) == 0 && do_wake("big", 0) == 0, "host cycle");
  CHECK(pat_check_sparse(b, n, 62) == (size_t)-1, "intact after the host cycle");
  cudaFree(b);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

/* Three blocks of their own handles; returns how many are mapped as kind (0 device, 1 host). */
enum { COPYFAIL_N = 3 };
static int count_as(char *const *b, size_t n, int kind) {
  int k = 0;
  for (int i = 0; i < COPYFAIL_N; i++) k += mapped_as(b[i], n) == kind;
  return k;
}
static bool all_intact(char *const *b, size_t n, unsigned long long seed) {
  for (int i = 0; i < COPYFAIL_N; i++)
    if (pat_check_sparse(b[i], n, seed + (unsigned)i) != (size_t)-1) return false;
  return true;
}

static void scenario_copyfail(void) {
  size_t n = 96 * MiB; /* two host buffers each: 64 MiB and 32 MiB, so two copies a block */
  char *b[COPYFAIL_N];
  for (int i = 0; i < COPYFAIL_N; i++) {
    b[i] = tagged_malloc("parts", n);
    if (!b[i]) return;
    pat_fill_sparse(b[i], n, 70 + (unsigned)i);
  }
  /* The third copy (the first of a second block) cannot be queued. */
  emu_fail_after("cuMemcpyDtoDAsync", 2, CUDA_ERROR_LAUNCH_FAILED, 1);
  int rc = do_sleep("parts", VMMSHIM_SLEEP_MAPPED);
  /* A sleep moves what it can: 0, and the answer says what stayed and why. */
  CHECK(rc == 0 && strstr(g_res.reason, "copying to host memory failed"), "a copy not queued: rc %d, %s", rc, g_res.reason);
  CHECK(g_res.released == n && g_res.skipped == 2 * n, "one block slept, two stayed (released %llu, skipped %llu MiB)",
        (unsigned long long)g_res.released >> 20, (unsigned long long)g_res.skipped >> 20);
  CHECK(count_as(b, n, 1) == 1 && count_as(b, n, 0) == 2, "one on host memory, two on the device");
  CHECK(all_intact(b, n, 70), "every byte intact");
  CHECK(do_wake("parts", 0) == 0 && count_as(b, n, 0) == COPYFAIL_N && all_intact(b, n, 70), "woken, intact");

  /* The wait for the second block's copies fails (a wait is one event per copy stream: two). */
  emu_fail_after("cuEventSynchronize", 2, CUDA_ERROR_LAUNCH_FAILED, 1);
  rc = do_sleep("parts", VMMSHIM_SLEEP_MAPPED);
  CHECK(rc == 0 && strstr(g_res.reason, "copying to host memory failed") && g_res.released == n && g_res.skipped == 2 * n, "a failed wait: rc %d, released %llu MiB, %s", rc,
        (unsigned long long)g_res.released >> 20, g_res.reason);
  CHECK(count_as(b, n, 1) == 1 && all_intact(b, n, 70), "the block before it slept, every byte intact");
  CHECK(do_wake("parts", 0) == 0 && all_intact(b, n, 70), "woken, intact");

  /* No events: whole streams are waited for, everything sleeps. */
  emu_fail_next("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY, 100);
  rc = do_sleep("parts", VMMSHIM_SLEEP_MAPPED);
  emu_fail_next("cuEventCreate", CUDA_SUCCESS, 0);
  CHECK(rc == 0 && g_res.host_mapped == 3 * n && count_as(b, n, 1) == COPYFAIL_N && all_intact(b, n, 70),
        "without events: rc %d, %llu MiB mapped from the host, intact", rc, (unsigned long long)g_res.host_mapped >> 20);
  for (int i = 0; i < COPYFAIL_N; i++) pat_fill_sparse(b[i], n, 80 + (unsigned)i); /* written while asleep */

  /* At the wake, the second copy back fails: every block stays on host memory. */
  emu_fail_after("cuMemcpyDtoDAsync", 1, CUDA_ERROR_LAUNCH_FAILED, 1);
  rc = do_wake("parts", 0);
  CHECK(rc != 0 && strstr(g_res.reason, "copying back") && g_res.restored == 0, "a copy back fails: rc %d, restored %llu, %s",
        rc, (unsigned long long)g_res.restored, g_res.reason);
  CHECK(count_as(b, n, 1) == COPYFAIL_N && all_intact(b, n, 80) && shim_tag_stats("parts").asleep,
        "still asleep, served from host memory, intact");
  /* A device mapping fails: that block stays on host memory, the others wake. */
  emu_fail_next("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY, 1);
  rc = do_wake("parts", 0);
  CHECK(rc != 0 && g_res.restored == 2 * n && count_as(b, n, 1) == 1 && count_as(b, n, 0) == 2,
        "a mapping fails: rc %d, restored %llu MiB, %s", rc, (unsigned long long)g_res.restored >> 20, g_res.reason);
  CHECK(all_intact(b, n, 80), "every byte intact");
  CHECK(do_wake("parts", 0) == 0 && count_as(b, n, 0) == COPYFAIL_N && all_intact(b, n, 80), "the next wake: all back, intact");
  for (int i = 0; i < COPYFAIL_N; i++) cudaFree(b[i]);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

/* Mapped mode copies each segment from a second mapping of its device handle (an alias), so
 * that the host buffers take the addresses while the copies run. Three blocks of 64 MiB, one
 * segment and one host buffer each (VMMSHIM_WAKE_MERGE=0 keeps them apart after a wake): the
 * alias is reserved and given back by every sleep (host mode has none); when it cannot be had the sleep still moves
 * everything; each later failure keeps the segment's bytes, on the device or on the host, or,
 * when even mapping its device memory back fails, discards it and says so. */
static long reservations(void) { return emu_now().live_reservations; }

/* A mapped sleep of tag "al" with one injected failure: it returns 0, says why, and moves what it can. */
static void alias_sleep_failing(const char *fn, int skip, CUresult err, const char *why, size_t released, size_t skipped) {
  emu_fail_after(fn, skip, err, 1);
  int rc = do_sleep("al", VMMSHIM_SLEEP_MAPPED);
  CHECK(rc == 0 && strstr(g_res.reason, why) && g_res.released == released && g_res.skipped == skipped,
        "%s fails: rc %d, released %llu MiB, skipped %llu MiB, %s", fn, rc, (unsigned long long)g_res.released >> 20,
        (unsigned long long)g_res.skipped >> 20, g_res.reason);
}

static void alias_wake_intact(char *const *b, size_t n) {
  CHECK(do_wake("al", 0) == 0 && count_as(b, n, 0) == COPYFAIL_N && all_intact(b, n, 90), "woken, intact");
}

static void scenario_alias(void) {
  size_t n = 64 * MiB;
  char *b[COPYFAIL_N];
  for (int i = 0; i < COPYFAIL_N; i++) {
    b[i] = tagged_malloc("al", n);
    if (!b[i]) return;
    pat_fill_sparse(b[i], n, 90 + (unsigned)i);
  }
  /* A first cycle in host mode makes the host buffers (a reservation each), kept for the next. */
  CHECK(do_sleep("al", VMMSHIM_SLEEP_HOST) == 0 && do_wake("al", 0) == 0 && all_intact(b, n, 90), "host mode: %s", g_res.reason);
  long resv = reservations();
  unsigned long long reserves = emu_now().n_cuMemAddressReserve;
  int rc = do_sleep("al", VMMSHIM_SLEEP_MAPPED);
  CHECK(rc == 0 && g_res.host_mapped == 3 * n && count_as(b, n, 1) == COPYFAIL_N && all_intact(b, n, 90),
        "slept through the alias: rc %d, %llu MiB mapped from the host", rc, (unsigned long long)g_res.host_mapped >> 20);
  CHECK(emu_now().n_cuMemAddressReserve == reserves + 1 && reservations() == resv,
        "one alias reserved and given back (%llu reserves, %ld live, %ld before)",
        emu_now().n_cuMemAddressReserve - reserves, reservations(), resv);
  alias_wake_intact(b, n);

  /* No alias: the reservation, or the second alias mapping, fails; the segments move after
   * their copies instead. */
  const char *no_alias[2] = {"cuMemAddressReserve", "cuMemMap"};
  for (int k = 0; k < 2; k++) {
    emu_fail_after(no_alias[k], k, CUDA_ERROR_OUT_OF_MEMORY, 1);
    rc = do_sleep("al", VMMSHIM_SLEEP_MAPPED);
    CHECK(rc == 0 && g_res.host_mapped == 3 * n && count_as(b, n, 1) == COPYFAIL_N && all_intact(b, n, 90) &&
              reservations() == resv,
          "%s fails: rc %d, %llu MiB mapped from the host, %ld reservations", no_alias[k], rc,
          (unsigned long long)g_res.host_mapped >> 20, reservations());
    alias_wake_intact(b, n);
  }

  /* The second block's address cannot be unmapped: it stays on the device, the others sleep. */
  alias_sleep_failing("cuMemUnmap", 1, CUDA_ERROR_INVALID_VALUE, "cuMemUnmap failed", 2 * n, n);
  CHECK(mapped_as(b[1], n) == 0 && count_as(b, n, 1) == 2 && all_intact(b, n, 90) && reservations() == resv,
        "the second on the device, the others on host memory, intact");
  alias_wake_intact(b, n);

  /* The second block's host buffer cannot be mapped at its address (three alias mappings, then
   * one host mapping each): its bytes are kept on the host, unmapped there, and come back. */
  alias_sleep_failing("cuMemMap", 4, CUDA_ERROR_OUT_OF_MEMORY, "kept on the host", 3 * n, 0);
  CHECK(g_res.host_mapped == 2 * n && mapped_as(b[1], n) == -1 && count_as(b, n, 1) == 2 && reservations() == resv,
        "the second is unmapped, the others on host memory (%llu MiB)", (unsigned long long)g_res.host_mapped >> 20);
  alias_wake_intact(b, n);

  /* The wait for the second block's copy fails (one event per copy stream: two a block): the
   * first sleeps, the others get their device memory back at their addresses. */
  alias_sleep_failing("cuEventSynchronize", 2, CUDA_ERROR_LAUNCH_FAILED, "copying to host memory failed", n, 2 * n);
  CHECK(mapped_as(b[0], n) == 1 && count_as(b, n, 0) == 2 && all_intact(b, n, 90) && reservations() == resv,
        "the first on host memory, the others back on the device, intact");
  alias_wake_intact(b, n);

  /* The same, and mapping the second block's device memory back fails too (three alias and
   * three host mappings came first): its bytes are lost, it sleeps as discarded and wakes to
   * zeros; the third is back on the device. */
  emu_fail_after("cuEventSynchronize", 2, CUDA_ERROR_LAUNCH_FAILED, 1);
  emu_fail_after("cuMemMap", 6, CUDA_ERROR_OUT_OF_MEMORY, 1);
  rc = do_sleep("al", VMMSHIM_SLEEP_MAPPED);
  CHECK(rc == 0 && g_res.discarded == n && g_res.released == 2 * n && g_res.skipped == n,
        "a wait and a mapping back fail: rc %d, discarded %llu MiB, released %llu MiB, skipped %llu MiB", rc,
        (unsigned long long)g_res.discarded >> 20, (unsigned long long)g_res.released >> 20,
        (unsigned long long)g_res.skipped >> 20);
  CHECK(mapped_as(b[0], n) == 1 && mapped_as(b[1], n) == -1 && mapped_as(b[2], n) == 0 && reservations() == resv,
        "the first on host memory, the second unmapped, the third on the device");
  CHECK(do_wake("al", VMMSHIM_WAKE_ZERO) == 0 && count_as(b, n, 0) == COPYFAIL_N, "woken: %s", g_res.reason);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i += 4096) nonzero += b[1][i] != 0;
  CHECK(nonzero == 0 && pat_check_sparse(b[0], n, 90) == (size_t)-1 && pat_check_sparse(b[2], n, 92) == (size_t)-1,
        "the lost block wakes as zeros (%zu pages not), the others intact", nonzero);
  for (int i = 0; i < COPYFAIL_N; i++) cudaFree(b[i]);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

/* Four neighbouring blocks of 96 MiB, each on a handle of its own, woken by handles of at most
 * VMMSHIM_WAKE_MERGE bytes (the test's environment sets it; MERGE_EXPECT says how many handles a
 * wake makes for them). */
enum { MERGE_N = 4 };
static unsigned long long creates(void) { return emu_now().n_cuMemCreate; }
static unsigned long long releases(void) { return emu_now().n_cuMemRelease; }

static void scenario_merge(void) {
  size_t n = 96 * MiB;
  const char *e = getenv("MERGE_EXPECT"), *f = getenv("MERGE_FIRST");
  long expect = e ? atol(e) : -1, first = f ? atol(f) : -1; /* handles a wake makes; segments of the first */
  size_t dev0 = emu_device_used(0);
  char *b[MERGE_N];
  for (int i = 0; i < MERGE_N; i++) {
    b[i] = tagged_malloc("m", n);
    if (!b[i]) return;
    pat_fill_sparse(b[i], n, 90 + (unsigned)i);
  }
  for (int i = 1; i < MERGE_N; i++)
    CHECK(b[i] == b[i - 1] + n, "block %d follows block %d (the large heap grows in place)", i, i - 1);
  const vmmshim_sleep_mode_t modes[3] = {VMMSHIM_SLEEP_HOST, VMMSHIM_SLEEP_MAPPED, VMMSHIM_SLEEP_DISCARD};
  for (int m = 0; m < 3; m++) {
    unsigned long long r0 = releases();
    CHECK(do_sleep("m", modes[m]) == 0 && g_res.released == MERGE_N * n, "sleep mode %d: released %llu MiB, %s", m,
          (unsigned long long)g_res.released >> 20, g_res.reason);
    /* The first sleep releases the allocation's four handles, the later ones what a wake made. */
    unsigned long long released = releases() - r0, c0 = creates();
    CHECK(released == (unsigned long long)(m == 0 ? MERGE_N : expect), "mode %d: the sleep released %llu device handles",
          m, released);
    CHECK(do_wake("m", VMMSHIM_WAKE_ZERO) == 0 && g_res.restored == MERGE_N * n, "wake mode %d: restored %llu MiB, %s", m,
          (unsigned long long)g_res.restored >> 20, g_res.reason);
    long made = (long)(creates() - c0);
    CHECK(made == expect, "mode %d: the wake made %ld device handles for %d segments, expected %ld", m, made, MERGE_N,
          expect);
    bool intact = true;
    for (int i = 0; i < MERGE_N; i++) {
      if (modes[m] == VMMSHIM_SLEEP_DISCARD) intact &= b[i][0] == 0 && b[i][n - 1] == 0 && b[i][n / 2] == 0;
      else intact &= pat_check_sparse(b[i], n, 90 + (unsigned)i) == (size_t)-1;
      intact &= mapped_as(b[i], n) == 0;
    }
    CHECK(intact, "mode %d: every block on device memory at its address, %s", m,
          modes[m] == VMMSHIM_SLEEP_DISCARD ? "zeros" : "its bytes intact");
    if (modes[m] == VMMSHIM_SLEEP_DISCARD) break;
  }
  for (int i = 0; i < MERGE_N; i++) pat_fill_sparse(b[i], n, 100 + (unsigned)i);

  /* A device mapping fails at the wake: the segments of that handle (the first) stay asleep,
   * served from host memory (mapped), intact; the next wake brings them back. */
  CHECK(do_sleep("m", VMMSHIM_SLEEP_MAPPED) == 0, "mapped sleep: %s", g_res.reason);
  emu_fail_next("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY, 1);
  int rc = do_wake("m", 0);
  int on_host = 0;
  for (int i = 0; i < MERGE_N; i++) on_host += mapped_as(b[i], n) == 1;
  CHECK(rc != 0 && on_host == first && g_res.restored == (MERGE_N - first) * n,
        "a mapping fails: rc %d, %d blocks left on host memory (expected %ld), restored %llu MiB", rc, on_host, first,
        (unsigned long long)g_res.restored >> 20);
  bool intact = true;
  for (int i = 0; i < MERGE_N; i++) intact &= pat_check_sparse(b[i], n, 100 + (unsigned)i) == (size_t)-1;
  CHECK(intact, "every byte intact");
  CHECK(do_wake("m", 0) == 0 && g_res.restored == (size_t)first * n, "the next wake: %s", g_res.reason);
  for (int i = 0; i < MERGE_N; i++)
    intact &= pat_check_sparse(b[i], n, 100 + (unsigned)i) == (size_t)-1 && mapped_as(b[i], n) == 0;
  CHECK(intact, "all back on the device, intact");

  /* Memory woken together goes back together: with every block freed, a trim gives back all. */
  for (int i = 0; i < MERGE_N; i++) cudaFree(b[i]);
  vmmshim_trim();
  vmmshim_release_host(0);
  CHECK(emu_device_used(0) <= dev0 && emu_host_used() == 0, "all given back: device %zu -> %zu MiB, host %zu MiB",
        dev0 >> 20, emu_device_used(0) >> 20, emu_host_used() >> 20);
  CHECK(emu_violations() == 0, "no contract violation (%d)", emu_violations());
}

/* The importer of scenario ipc: opens the handle given in SLEEP_IPC_HANDLE (hex), says "open" on
 * stdout, then closes it when a line arrives on stdin. */
static void scenario_importer(void) {
  const char *hex = getenv("SLEEP_IPC_HANDLE");
  cudaIpcMemHandle_t h;
  memset(&h, 0, sizeof h);
  for (size_t i = 0; hex && i < sizeof h && hex[2 * i] && hex[2 * i + 1]; i++) {
    unsigned v = 0;
    sscanf(hex + 2 * i, "%2x", &v);
    ((unsigned char *)&h)[i] = (unsigned char)v;
  }
  void *p = NULL;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  CHECK(e == cudaSuccess && p, "importer opens the handle: %s", cudaGetErrorName(e));
  printf("open\n");
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) line[0] = 0;
  if (p) CHECK(cudaIpcCloseMemHandle(p) == cudaSuccess, "importer closes");
}

/* A block another process holds open through CUDA IPC stays on the device; once closed, it sleeps. */
static void scenario_ipc(const char *self) {
  size_t n = 8 * MiB;
  char *x = tagged_malloc("shared", n);
  char *y = tagged_malloc("shared", 80 * MiB); /* on a handle of its own: not held */
  if (!x || !y) return;
  pat_fill_sparse(x, n, 71);
  cudaIpcMemHandle_t h;
  CHECK(cudaIpcGetMemHandle(&h, x) == cudaSuccess, "export");
  char hex[2 * sizeof h + 1];
  for (size_t i = 0; i < sizeof h; i++) sprintf(hex + 2 * i, "%02x", ((unsigned char *)&h)[i]);
  int to_child[2], from_child[2];
  if (pipe(to_child) || pipe(from_child)) return;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    close(to_child[1]);
    close(from_child[0]);
    setenv("SLEEP_IPC_HANDLE", hex, 1);
    execl("/proc/self/exe", self, "importer", (char *)NULL);
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  FILE *in = fdopen(from_child[0], "r");
  char line[256] = "";
  int opened = 0;
  while (in && fgets(line, sizeof line, in)) {
    if (!strncmp(line, "open", 4)) {
      opened = 1;
      break;
    }
    fputs(line, stdout); /* the importer's failures, if any */
  }
  CHECK(opened, "the importer opened the block");
  CHECK(do_sleep("shared", VMMSHIM_SLEEP_HOST) == 0, "sleep: %s", g_res.reason);
  CHECK(g_res.skipped >= n && strstr(g_res.reason, "importer") != NULL, "held block skipped: %llu (%s)",
        (unsigned long long)g_res.skipped, g_res.reason);
  CHECK(mapped_as(x, n) == 0 && mapped_as(y, 80 * MiB) == -1, "the held block stays, the other sleeps");
  CHECK(do_wake("shared", 0) == 0, "wake");
  if (write(to_child[1], "close\n", 6) != 6) CHECK(0, "tell the importer");
  int st = 0;
  waitpid(pid, &st, 0);
  while (in && fgets(line, sizeof line, in)) fputs(line, stdout); /* the importer's checks */
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the importer ran clean: status %d", st);
  /* The exporter's server sees the importer's connection end in its own time (its thread, under
   * load later than the importer's exit): a sleep that still finds the block held is woken and
   * tried again, for up to 10 s. */
  int rc;
  double until = now_s() + 10;
  for (;;) {
    rc = do_sleep("shared", VMMSHIM_SLEEP_HOST);
    if ((rc == 0 && g_res.skipped == 0) || now_s() > until) break;
    do_wake("shared", 0);
    sleep_ms(20);
  }
  CHECK(rc == 0 && g_res.skipped == 0, "closed: everything sleeps (%llu skipped)", (unsigned long long)g_res.skipped);
  CHECK(do_wake("shared", 0) == 0 && pat_check_sparse(x, n, 71) == (size_t)-1, "intact");
  if (in) fclose(in);
  close(to_child[1]);
  cudaFree(x), cudaFree(y);
}

/* Memory allocated with no tag set is "untagged", never "default" (the tag of a region that
 * names none): sleeping "default" leaves it on the device with its bytes; only naming it sleeps it. */
static void scenario_untagged(void) {
  char name[VMMSHIM_TAG_MAX];
  CHECK(vmmshim_get_tag(name, sizeof name) == 0 && !strcmp(name, "untagged"), "no tag set: tag '%s'", name);
  char *outside = must_malloc(1 * MiB);
  pat_fill(outside, 1 * MiB, 41);
  char *inside = tagged_malloc("default", 4 * MiB);
  pat_fill(inside, 4 * MiB, 42);
  CHECK(shim_tag_stats("untagged").live >= 1 * MiB && shim_tag_stats("default").live >= 4 * MiB,
        "the outside block in untagged, the region's in default");
  CHECK(do_sleep("default", VMMSHIM_SLEEP_HOST) == 0 && g_res.released >= 4 * MiB, "sleep default: %s",
        g_res.reason);
  CHECK(mapped_as(inside, 4 * MiB) == -1, "the region's block left the device");
  CHECK(mapped_as(outside, 1 * MiB) == 0 && pat_check(outside, 1 * MiB, 41) == (size_t)-1,
        "the untagged block stayed on the device with its bytes");
  CHECK(!shim_tag_stats("untagged").asleep, "untagged is awake");
  void *home = NULL;
  size_t len = 0;
  CHECK(vmmshim_host_copy(inside, &home, &len) == 0 && home && len >= 4 * MiB &&
            pat_check(home, 4 * MiB, 42) == (size_t)-1,
        "host_copy: the sleeping block's bytes in a host buffer (%zu bytes there)", len);
  CHECK(vmmshim_host_copy(inside + 1 * MiB, &home, &len) == 0 && len >= 3 * MiB &&
            ((unsigned char *)home)[0] == pat_byte(42, 1 * MiB) &&
            ((unsigned char *)home)[3 * MiB - 1] == pat_byte(42, 4 * MiB - 1),
        "host_copy inside the block: from that offset");
  CHECK(vmmshim_host_copy(outside, &home, &len) == -ENOENT && !home && !len, "host_copy of awake memory: ENOENT");
  CHECK(do_wake("default", 0) == 0 && pat_check(inside, 4 * MiB, 42) == (size_t)-1, "wake default: bytes back");
  CHECK(do_sleep("untagged", VMMSHIM_SLEEP_HOST) == 0 && mapped_as(outside, 1 * MiB) == -1 &&
            mapped_as(inside, 4 * MiB) == 0,
        "naming untagged sleeps it, and only it");
  CHECK(do_wake("untagged", 0) == 0 && pat_check(outside, 1 * MiB, 41) == (size_t)-1, "wake untagged: bytes back");
  cudaFree(outside);
  cudaFree(inside);
}

/* The CPU's access to the host memory at addr, as the driver tracks it (-1: not answered). */
static long long cpu_access(const void *addr) {
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_HOST_NUMA, 0};
  unsigned long long f = 0;
  return cuMemGetAccess(&f, &loc, (CUdeviceptr)(uintptr_t)addr) == CUDA_SUCCESS ? (long long)f : -1;
}

static void scenario_view(void) {
  const size_t n = 4 * MiB;
  unsigned char *x = tagged_malloc("kv", n);
  CHECK(cuMemsetD8((CUdeviceptr)(uintptr_t)x, 0x5A, n) == CUDA_SUCCESS && cuCtxSynchronize() == CUDA_SUCCESS,
        "the device writes x");
  void *view = (void *)1;
  CHECK(vmmshim_host_view(x, n, &view) == -ENOENT && view == NULL, "awake: ENOENT");
  CHECK(do_sleep("kv", VMMSHIM_SLEEP_HOST) == 0 && mapped_as(x, n) == -1, "kv sleeps in host mode: %s", g_res.reason);
  void *home = NULL;
  size_t len = 0;
  CHECK(vmmshim_host_copy(x, &home, &len) == 0, "host_copy finds x's bytes");
  CHECK(vmmshim_host_view(x, n, &view) == 0 && view == home, "the view is the host buffer's own address, no copy: %p, %p",
        view, home);
  unsigned char *v = view;
  bool same = v != NULL;
  for (size_t i = 0; same && i < n; i += 4096) same = v[i] == 0x5A && v[i + 4095] == 0x5A;
  CHECK(same, "the view shows what the device wrote");
  CHECK(v && emu_host_mapped((CUdeviceptr)(uintptr_t)v) == 1 &&
            cpu_access(v) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        "it is host memory, the CPU given READWRITE access by the driver (%lld)", v ? cpu_access(v) : -1);
  CHECK(vmmshim_host_view(x + 1 * MiB, 1 * MiB, &view) == 0 && view == (char *)home + 1 * MiB, "at an offset");
  CHECK(vmmshim_host_view(x, 0, &view) == -EINVAL && vmmshim_host_view(x, n, NULL) == -EINVAL, "size 0, NULL: EINVAL");
  if (v) memset(v, 0x33, 4096);
  CHECK(do_wake("kv", 0) == 0 && x[0] == 0x33 && x[4095] == 0x33 && x[4096] == 0x5A, "a write in the view is woken");
  CHECK(vmmshim_host_view(x, n, &view) == -ENOENT, "awake again: ENOENT");

  int rs = do_sleep("kv", VMMSHIM_SLEEP_MAPPED), rv = vmmshim_host_view(x, n, &view);
  CHECK(rs == 0 && rv == 0 && view && ((unsigned char *)view)[8192] == 0x5A, "mapped mode: a view too (%d, %d: %s)", rs, rv,
        g_res.reason);
  CHECK(do_wake("kv", 0) == 0, "wake");

  const size_t big = 96 * MiB; /* more than one 64 MiB host buffer */
  unsigned char *y = tagged_malloc("big", big);
  pat_fill_sparse(y, big, 7);
  CHECK(do_sleep("big", VMMSHIM_SLEEP_HOST) == 0, "a 96 MiB block sleeps in host mode");
  CHECK(vmmshim_host_view(y, big, &view) == -EXDEV && view == NULL, "over two host buffers: EXDEV");
  CHECK(vmmshim_host_view(y, 4096, &view) == 0 && view, "its first page is in one buffer");
  CHECK(do_wake("big", 0) == 0 && pat_check_sparse(y, big, 7) == (size_t)-1, "wake big: intact");

  CHECK(do_sleep("kv", VMMSHIM_SLEEP_DISCARD) == 0 && vmmshim_host_view(x, n, &view) == -EXDEV, "discarded: EXDEV");
  CHECK(do_wake("kv", VMMSHIM_WAKE_ZERO) == 0, "wake");
  char tmpl[] = "/tmp/vmmshim-view-XXXXXX";
  char *dir = mkdtemp(tmpl);
  CHECK(dir && vmmshim_set_disk_dir(dir) == 0, "a disk directory");
  CHECK(do_sleep("kv", VMMSHIM_SLEEP_DISK) == 0 && vmmshim_host_view(x, n, &view) == -EXDEV, "on disk: EXDEV: %s",
        g_res.reason);
  CHECK(do_wake("kv", 0) == 0, "wake from disk");
  if (dir) rmdir(dir);
  cudaFree(x);
  cudaFree(y);
}

static void scenario_viewoff(void) {
  const size_t n = 4 * MiB;
  unsigned char *x = tagged_malloc("kv", n);
  pat_fill(x, n, 12);
  CHECK(do_sleep("kv", VMMSHIM_SLEEP_HOST) == 0, "kv sleeps in host mode: %s", g_res.reason);
  void *home = NULL, *view = (void *)1;
  size_t len = 0;
  CHECK(vmmshim_host_copy(x, &home, &len) == 0 && pat_check(home, n, 12) == (size_t)-1, "host_copy finds the bytes");
  CHECK(home && cpu_access(home) == 0, "no CPU access given");
  CHECK(vmmshim_host_view(x, n, &view) == -ENOTSUP && view == NULL, "host_view: ENOTSUP");
  CHECK(do_wake("kv", 0) == 0 && pat_check(x, n, 12) == (size_t)-1, "wake: intact");
  cudaFree(x);
}

static void run_scenario(const char *name) {
  if (!strcmp(name, "peers") || !strcmp(name, "skipsum")) emu_set_device_count(2);
  if (!strcmp(name, "nohost") || !strcmp(name, "skipsum")) emu_set_host_vmm(0);
  if (!strcmp(name, "viewoff")) emu_set_host_cpu_access(0);
  CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  CHECK(shim_active() == 1 && vmmshim_sleep, "the shim is active");
  if (!vmmshim_sleep) return;
  if (!strcmp(name, "modes")) scenario_modes();
  else if (!strcmp(name, "isolate")) scenario_isolate();
  else if (!strcmp(name, "during")) scenario_during();
  else if (!strcmp(name, "nowake")) scenario_nowake();
  else if (!strcmp(name, "capture")) scenario_capture();
  else if (!strcmp(name, "gate")) scenario_gate();
  else if (!strcmp(name, "cycles")) scenario_cycles();
  else if (!strcmp(name, "levels")) scenario_levels();
  else if (!strcmp(name, "process")) scenario_process();
  else if (!strcmp(name, "limit")) scenario_limit();
  else if (!strcmp(name, "peers")) scenario_peers();
  else if (!strcmp(name, "nohost")) scenario_nohost();
  else if (!strcmp(name, "skipsum")) scenario_skipsum();
  else if (!strcmp(name, "big")) scenario_big();
  else if (!strcmp(name, "copyfail")) scenario_copyfail();
  else if (!strcmp(name, "merge")) scenario_merge();
  else if (!strcmp(name, "alias")) scenario_alias();
  else if (!strcmp(name, "ipc")) scenario_ipc(g_self);
  else if (!strcmp(name, "importer")) scenario_importer();
  else if (!strcmp(name, "untagged")) scenario_untagged();
  else if (!strcmp(name, "view")) scenario_view();
  else if (!strcmp(name, "viewoff")) scenario_viewoff();
  else CHECK(0, "unknown scenario %s", name);
}

int main(int argc, char **argv) {
  g_self = argv[0];
  const char *child = check_child_main(argc, argv);
  if (child) {
    run_scenario(child);
    return check_child_summary(child);
  }
  CHECK(vmmshim_api_version && vmmshim_api_version() == VMMSHIM_API_VERSION, "the shim is preloaded, API version %d",
        vmmshim_api_version ? vmmshim_api_version() : -1);
  if (!vmmshim_api_version) return check_summary();
  check_run_child("modes", NULL);
  check_run_child("isolate", NULL);
  check_run_child("during", NULL);
  check_run_child("nowake", NULL);
  check_run_child("capture", "VMMSHIM_SLEEP_WAIT=200", NULL);
  check_run_child("gate", NULL);
  check_run_child("cycles", NULL);
  check_run_child("levels", NULL);
  check_run_child("process", "VMMSHIM_TAG=weights", NULL);
  check_run_child("limit", "VMMSHIM_HOST_LIMIT=128M", NULL);
  check_run_child("peers", NULL);
  check_run_child("nohost", NULL);
  check_run_child("skipsum", NULL);
  check_run_child("big", NULL);
  check_run_child("copyfail", "VMMSHIM_WAKE_MERGE=0", NULL);
  check_run_child("alias", "VMMSHIM_WAKE_MERGE=0", NULL);
  check_run_child("merge", "MERGE_EXPECT=1", "MERGE_FIRST=4", NULL);                           /* the default: 1 GiB */
  check_run_child("merge", "VMMSHIM_WAKE_MERGE=200M", "MERGE_EXPECT=2", "MERGE_FIRST=2", NULL); /* 2 + 2 segments */
  check_run_child("merge", "VMMSHIM_WAKE_MERGE=0", "MERGE_EXPECT=4", "MERGE_FIRST=1", NULL); /* one per segment */
  check_run_child("merge", "VMMSHIM_MAX_HANDLE=300M", "MERGE_EXPECT=2", "MERGE_FIRST=3", NULL); /* 3 + 1: the cap */
  check_run_child("ipc", NULL);
  check_run_child("untagged", NULL);
  check_run_child("view", NULL);
  check_run_child("viewoff", NULL);
  return check_summary();
}
