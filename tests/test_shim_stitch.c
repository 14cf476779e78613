/* test_shim_stitch: blocks served by a stitch (VMMSHIM_STITCH, docs/design.md "Stitching") work
 * as any other, through the program's own calls under the shim on the host emulation. Each
 * scenario runs in a child process (the shim reads its options once) and makes a stitched block
 * the same way: two 64 MiB blocks (a handle each), the first freed (an idle handle the idle
 * budget keeps), then 96 MiB, which fits no free block: served by the idle handle and a new
 * 32 MiB one, mapped side by side. Scenarios:
 *   bytes   the stitch happened (160 MiB of handles, not 224; no handle released); bytes written
 *           through the block read back; no handle lies under two live blocks (the emulation's
 *           check); freed and trimmed, nothing stays mapped; the exit stats count the stitch.
 *   off     VMMSHIM_STITCH unset (off, the default): the same requests map 224 MiB (the idle
 *           handle stays idle). The other scenarios run with VMMSHIM_STITCH=1.
 *   sleep   the blocks under a tag, slept to host memory and woken: the stitched block's bytes
 *           come back at the same address.
 *   ipc     the stitched block is exported (cudaIpcGetMemHandle); a second process opens it and
 *           reads the bytes written here across both handles.
 *   peers   device 1 has peer access to device 0: the stitched block (its moved handle too) is
 *           writable by device 1; after peer access is disabled, it is not.
 *   planted the emulation's contract check catches one handle mapped under two live ranges. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

#pragma weak vmmshim_sleep
#pragma weak vmmshim_wake
#pragma weak vmmshim_set_tag

typedef struct stitched_s {
  void *b, *c; /* the live 64 MiB block, and the stitched 96 MiB one */
  unsigned long long mapped_after; /* handle bytes once c is served */
} stitched_t;

static stitched_t make_stitched(void) {
  stitched_t s = {0};
  void *a = must_malloc(64 * MiB);
  s.b = must_malloc(64 * MiB);
  CHECK(a && s.b && emu_now().handle_bytes == 128 * MiB, "two 64 MiB handles (%llu MiB)",
        emu_now().handle_bytes / MiB);
  CHECK(cudaFree(a) == cudaSuccess, "free the first: an idle handle");
  unsigned long long rel = emu_now().n_cuMemRelease;
  s.c = must_malloc(96 * MiB);
  s.mapped_after = emu_now().handle_bytes;
  CHECK(emu_now().n_cuMemRelease == rel, "no handle released by the growth");
  return s;
}

/* A pattern over n bytes at p, seeded: written (check 0) or checked (returns the bad bytes). */
static size_t pattern(void *p, size_t n, unsigned seed, int check) {
  unsigned char *q = p;
  size_t bad = 0;
  for (size_t i = 0; i < n; i += 4093) {
    unsigned char v = (unsigned char)(i * 131 + seed);
    if (!check) q[i] = v;
    else bad += q[i] != v;
  }
  return bad;
}

static int shared_handles(const stitched_t *s) {
  CUdeviceptr va[2] = {(CUdeviceptr)(uintptr_t)s->b, (CUdeviceptr)(uintptr_t)s->c};
  size_t len[2] = {64 * MiB, 96 * MiB};
  return emu_shared_handles(va, len, 2);
}

static void scenario_bytes(void) {
  emu_set_device_memory(0, 8ull << 30);
  stitched_t s = make_stitched();
  CHECK(s.mapped_after == 160 * MiB, "stitched: %llu MiB of handles (without the stitch: 224)", s.mapped_after / MiB);
  CHECK(s.c && pattern(s.c, 96 * MiB, 7, 0) == 0 && pattern(s.b, 64 * MiB, 9, 0) == 0, "written");
  CHECK(pattern(s.c, 96 * MiB, 7, 1) == 0, "the stitched block's bytes read back, across both handles");
  CHECK(pattern(s.b, 64 * MiB, 9, 1) == 0, "and b's are untouched");
  CHECK(shared_handles(&s) == 0, "no handle under two live blocks");
  CHECK(cudaFree(s.c) == cudaSuccess && cudaFree(s.b) == cudaSuccess, "free both");
  CHECK(shim_trim() == 160 * MiB && emu_now().handle_bytes == 0, "a trim gives back every handle (%llu MiB left)",
        emu_now().handle_bytes / MiB);
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
}

static void scenario_off(void) {
  emu_set_device_memory(0, 8ull << 30);
  stitched_t s = make_stitched();
  CHECK(s.mapped_after == 224 * MiB, "stitch off: %llu MiB of handles", s.mapped_after / MiB);
  CHECK(cudaFree(s.c) == cudaSuccess && cudaFree(s.b) == cudaSuccess, "free both");
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
}

static void scenario_sleep(void) {
  emu_set_device_memory(0, 8ull << 30);
  CHECK(vmmshim_set_tag("st") == 0, "tag st");
  stitched_t s = make_stitched();
  vmmshim_set_tag(NULL);
  CHECK(s.mapped_after == 160 * MiB, "stitched in the tag's pool: %llu MiB", s.mapped_after / MiB);
  CHECK(s.c && pattern(s.c, 96 * MiB, 3, 0) == 0, "written");
  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  int e = vmmshim_sleep("st", VMMSHIM_SLEEP_HOST, &r, sizeof r);
  CHECK(e == 0 && r.released == 160 * MiB && r.to_host >= 160 * MiB, "asleep: %d, %llu MiB given back", e,
        (unsigned long long)(r.released / MiB));
  e = vmmshim_wake("st", 0, &r, sizeof r);
  CHECK(e == 0 && r.restored >= 160 * MiB, "woken: %d, %llu MiB mapped again", e, (unsigned long long)r.restored);
  CHECK(pattern(s.c, 96 * MiB, 3, 1) == 0, "the stitched block's bytes are back at its address");
  CHECK(shared_handles(&s) == 0, "no handle under two live blocks after the wake");
  CHECK(cudaFree(s.c) == cudaSuccess && cudaFree(s.b) == cudaSuccess, "free both");
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
}

static void scenario_ipc(void) {
  emu_set_device_memory(0, 8ull << 30);
  stitched_t s = make_stitched();
  CHECK(s.mapped_after == 160 * MiB, "stitched: %llu MiB", s.mapped_after / MiB);
  CHECK(s.c && pattern(s.c, 96 * MiB, 5, 0) == 0, "written");
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, s.c);
  CHECK(e == cudaSuccess, "the stitched block is exported: %s", cudaGetErrorName(e));
  char hex[2 * sizeof h.reserved + 16];
  strcpy(hex, "STITCH_IPC=");
  for (size_t i = 0; i < sizeof h.reserved; i++) sprintf(hex + 11 + 2 * i, "%02x", (unsigned char)h.reserved[i]);
  if (e == cudaSuccess) check_run_child("ipc_open", hex, NULL);
  CHECK(cudaFree(s.c) == cudaSuccess && cudaFree(s.b) == cudaSuccess, "free both");
  CHECK(emu_violations() == 0, "%d contract violations", emu_violations());
}

static void scenario_ipc_open(void) {
  const char *hex = getenv("STITCH_IPC");
  cudaIpcMemHandle_t h;
  memset(&h, 0, sizeof h);
  for (size_t i = 0; hex && i < sizeof h.reserved && hex[2 * i]; i++) {
    unsigned v = 0;
    sscanf(hex + 2 * i, "%2x", &v);
    h.reserved[i] = (char)v;
  }
  void *p = NULL;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  CHECK(e == cudaSuccess && p, "opened in another process: %s", cudaGetErrorName(e));
  if (e != cudaSuccess || !p) return;
  CHECK(pattern(p, 96 * MiB, 5, 1) == 0, "the exporter's bytes, across both handles");
  CHECK(cudaIpcCloseMemHandle(p) == cudaSuccess, "closed");
}

static void scenario_peers(void) {
  emu_set_device_count(2);
  emu_set_device_memory(0, 8ull << 30);
  CHECK(cudaSetDevice(1) == cudaSuccess && cudaDeviceEnablePeerAccess(0, 0) == cudaSuccess, "device 1 -> 0");
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  stitched_t s = make_stitched();
  CHECK(s.mapped_after == 160 * MiB, "stitched: %llu MiB", s.mapped_after / MiB);
  CHECK(s.c && emu_device_access(1, (CUdeviceptr)(uintptr_t)s.c, 96 * MiB, 1) == 0,
        "the peer writes the whole stitched block");
  CHECK(cudaSetDevice(1) == cudaSuccess && cudaDeviceDisablePeerAccess(0) == cudaSuccess, "access off");
  long faults = emu_device_faults();
  CHECK(emu_device_access(1, (CUdeviceptr)(uintptr_t)s.c, 96 * MiB, 1) != 0, "and then it may not");
  CHECK(emu_device_faults() == faults + 1, "one refusal");
  CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
  CHECK(cudaFree(s.c) == cudaSuccess && cudaFree(s.b) == cudaSuccess, "free both");
  CHECK(emu_violations() == 1, "the one refusal asked for, no other violation (%d)", emu_violations());
}

static void scenario_planted(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "device");
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS, "context");
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  size_t n = 2 * MiB;
  CHECK(cuMemAddressReserve(&va, 2 * n, 0, 0, 0) == CUDA_SUCCESS && cuMemCreate(&h, n, &prop, 0) == CUDA_SUCCESS,
        "a reservation and a handle");
  CHECK(cuMemMap(va, n, 0, h, 0) == CUDA_SUCCESS && cuMemMap(va + n, n, 0, h, 0) == CUDA_SUCCESS,
        "the handle mapped twice (the driver allows it)");
  CUdeviceptr v[2] = {va, va + n};
  size_t len[2] = {n, n};
  int before = emu_violations();
  CHECK(emu_shared_handles(v, len, 1) == 0, "one live range alone: nothing shared");
  CHECK(emu_shared_handles(v, len, 2) == 1 && emu_violations() == before + 1,
        "both live: the contract check catches the handle under two live ranges");
  CHECK(cuMemUnmap(va, 2 * n) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS &&
            cuMemAddressFree(va, 2 * n) == CUDA_SUCCESS,
        "undone");
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(120);
    if (!strcmp(sc, "bytes")) scenario_bytes();
    else if (!strcmp(sc, "off")) scenario_off();
    else if (!strcmp(sc, "sleep")) scenario_sleep();
    else if (!strcmp(sc, "ipc")) scenario_ipc();
    else if (!strcmp(sc, "ipc_open")) scenario_ipc_open();
    else if (!strcmp(sc, "peers")) scenario_peers();
    else if (!strcmp(sc, "planted")) scenario_planted();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  check_run_child("bytes", "VMMSHIM_STITCH=1", "VMMSHIM_STATS=1", NULL);
  CHECK(strstr(check_child_output, "stats: stitches 1 (growths that mapped 1 idle handles again, 64.0 MiB not created "
                                   "anew)") != NULL,
        "the exit stats count the stitch");
  check_run_child("off", NULL); /* the default */
  check_run_child("sleep", "VMMSHIM_STITCH=1", NULL);
  check_run_child("ipc", "VMMSHIM_STITCH=1", NULL);
  check_run_child("peers", "VMMSHIM_STITCH=1", NULL);
  check_run_child("planted", NULL);
  return check_summary();
}
