/* test_shim_residue: what stays on the device after a sleep, and who owns it, on the emulation.
 *
 * A second shared object (tests/lib/residue_helper.c, libresidue_helper.so) makes memory of its
 * own, as NCCL does: VMM handles it maps itself (one exportable), pinned host memory, managed
 * memory and a graph with a memory node. The program itself allocates through the shim (a tag)
 * and makes one VMM handle of its own. One process per scenario (the shim reads its options once).
 *
 *   exact   after a sleep of the tag, vmmshim_residue's figures are exact: used is the emulated
 *           device's use, the pools, the helper's VMM memory, managed and graph memory and an
 *           array each as made, nothing unexplained; the helper is named for its VMM, managed and pinned host
 *           memory, the program for its own handle; the exportable handle counts as shared; the
 *           largest site is in the helper. Freed memory leaves the figures.
 *   growth  the helper keeps 2 MiB more at each cycle: the residue after the third sleep has grown
 *           4 MiB from the first one's, a warning names the helper's site, and the site grew 4 MiB.
 *   trace   VMMSHIM_TRACE: version 4, 'u' records for what the helper made and freed, 'r' records
 *           after the sleep (every owner, the helper's name), unexplained 0.
 *   ctl     `vmmshim ctl PID residue` over the control channel answers the same figures as JSON,
 *           and status counts the memory made outside the pools.
 *   foreign VMMSHIM_SLEEP_FOREIGN names the helper: a sleep of every tag takes its plain handle
 *           (bytes, access and the device's use checked at the wake), leaves its exportable one
 *           and the one mapped in halves (skipped with the reasons); a sleep of one tag leaves
 *           all; the helper freeing its memory while asleep, or by the old handle value after a
 *           wake, works with no contract violation.
 *   context contexts and modules take memory (emu_set_context_memory): the primary context and each
 *           module and library load are measured exactly, the first context (nothing to read free
 *           memory in, no NVML) is said not measured; unloads and a context's end give back.
 *   foreign-off  the option unset, naming another library, or malformed (said, none used):
 *           a sleep of every tag leaves the helper's memory.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "lib/residue_helper.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

#pragma weak vmmshim_sleep
#pragma weak vmmshim_wake
#pragma weak vmmshim_set_tag
#pragma weak vmmshim_residue
#pragma weak vmmshim_api_version

static const char *g_self;

static void *tagged(const char *tag, size_t n) {
  vmmshim_set_tag(tag);
  void *p = NULL;
  CHECK(cudaMalloc(&p, n) == cudaSuccess, "cudaMalloc %zu in %s", n, tag);
  vmmshim_set_tag(NULL);
  return p;
}

static int sleep_tag(const char *tag) {
  vmmshim_sleep_result_t r;
  return vmmshim_sleep(tag, VMMSHIM_SLEEP_HOST, &r, sizeof r);
}

static const vmmshim_residue_lib_t *lib_named(const vmmshim_residue_t *r, const char *name) {
  for (int i = 0; i < r->nlibs; i++)
    if (!strcmp(r->libs[i].name, name)) return &r->libs[i];
  return NULL;
}

/* The program's own VMM handle (not the helper's): attributed to this executable. */
static CUmemGenericAllocationHandle own_handle(size_t size) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h = 0;
  CHECK(cuMemCreate(&h, size, &prop, 0) == CUDA_SUCCESS, "the program's own cuMemCreate");
  return h;
}

static void scenario_exact(void) {
  void *w = tagged("weights", 8 * MiB);
  void *k = tagged("kv", 4 * MiB);
  helper_vmm_t a, b;
  CHECK(helper_vmm_make(6 * MiB, 0, 0, &a) == 0, "the helper maps 6 MiB");
  CHECK(helper_vmm_make(2 * MiB, 0, 1, &b) == 0, "the helper maps 2 MiB, exportable");
  void *pin = helper_pinned(3 * MiB), *pin2 = helper_pinned_flags(1 * MiB);
  CUdeviceptr man = helper_managed(2 * MiB);
  CUgraph g = helper_graph(4 * MiB);
  CUarray arr = helper_array(1024, 256); /* 1 MiB of floats */
  CHECK(pin && pin2 && man && g, "pinned %p %p, managed 0x%llx, graph %p", pin, pin2, (unsigned long long)man,
        (void *)g);
  CUmemGenericAllocationHandle own = own_handle(2 * MiB);
  CHECK(sleep_tag("weights") == 0, "sleep weights");

  vmmshim_residue_t r;
  CHECK(vmmshim_residue(&r, sizeof r) == 0, "vmmshim_residue");
  CHECK(vmmshim_residue(&r, sizeof r - 1) == -EINVAL, "a wrong size is refused");
  CHECK(vmmshim_residue(&r, sizeof r) == 0 && r.ndevices == 1, "one device: %d", r.ndevices);
  const vmmshim_residue_device_t *d = &r.devices[0];
  CHECK(d->measured && d->total == 4096 * MiB, "measured %d, total %llu", d->measured, (unsigned long long)d->total);
  CHECK(d->used == emu_device_used(0), "used %llu = the device's use %zu", (unsigned long long)d->used,
        emu_device_used(0));
  CHECK(d->tags == 4 * MiB, "the pools hold kv's 4 MiB after weights slept: %llu", (unsigned long long)d->tags);
  CHECK(d->libraries == 10 * MiB, "own VMM memory: the helper's 8 MiB and the program's 2: %llu",
        (unsigned long long)d->libraries);
  CHECK(d->managed == 2 * MiB, "managed %llu", (unsigned long long)d->managed);
  CHECK(d->graph == 4 * MiB, "graph memory %llu", (unsigned long long)d->graph);
  CHECK(arr && d->arrays == 1 * MiB, "the array, by the free memory it took: %llu", (unsigned long long)d->arrays);
  CHECK(d->unexplained == 0, "nothing unexplained: %lld", (long long)d->unexplained);
  CHECK(r.host_pinned == 4 * MiB, "pinned host %llu", (unsigned long long)r.host_pinned);
  CHECK(r.shared == 2 * MiB, "exportable %llu", (unsigned long long)r.shared);
  CHECK(r.seq == 1, "one sleep so far: %llu", (unsigned long long)r.seq);
  const vmmshim_residue_lib_t *h = lib_named(&r, "libresidue_helper.so"), *me = lib_named(&r, "test_shim_residue");
  CHECK(h && h->vmm == 8 * MiB && h->managed == 2 * MiB && h->host == 4 * MiB && h->arrays == 1 * MiB,
        "the helper: vmm %llu managed %llu host %llu arrays %llu", h ? (unsigned long long)h->vmm : 0ull,
        h ? (unsigned long long)h->managed : 0ull, h ? (unsigned long long)h->host : 0ull,
        h ? (unsigned long long)h->arrays : 0ull);
  CHECK(me && me->vmm == 2 * MiB, "the program's own handle under its name: %s (%s %s %s)", me ? "found" : "missing",
        r.libs[0].name, r.nlibs > 1 ? r.libs[1].name : "-", r.nlibs > 2 ? r.libs[2].name : "-");
  CHECK(r.nlibs >= 1 && !strcmp(r.libs[0].name, "libresidue_helper.so"), "the largest owner first: %s",
        r.nlibs ? r.libs[0].name : "none");
  CHECK(r.nsites >= 1 && !strcmp(r.sites[0].lib, "libresidue_helper.so") && r.sites[0].bytes == 8 * MiB &&
            r.sites[0].addr != 0, "the largest site: the helper's cuMemCreate, 8 MiB (%s, %llu)", r.nsites ? r.sites[0].lib : "-",
        r.nsites ? (unsigned long long)r.sites[0].bytes : 0ull);
  CHECK(!strstr(r.note, "not measured"), "every device measured: %s", r.note);
  CHECK(r.nsites >= 1 && r.sites[0].offset < r.sites[0].addr && r.sites[0].offset < 0x100000 &&
            !strncmp(r.sites[0].symbol, "helper_vmm_make+0x", 18),
        "the site's offset in the helper (0x%llx, not the address 0x%llx) and symbol '%s'",
        r.nsites ? (unsigned long long)r.sites[0].offset : 0ull, r.nsites ? (unsigned long long)r.sites[0].addr : 0ull,
        r.nsites ? r.sites[0].symbol : "");

  /* Freed memory leaves the figures. */
  CHECK(helper_vmm_free(&a) == 0 && helper_pinned_free(pin) == 0 && helper_managed_free(man) == 0, "frees");
  CHECK(cuGraphDestroy(g) == CUDA_SUCCESS && cuMemRelease(own) == CUDA_SUCCESS && helper_array_free(arr) == 0,
        "graph and array destroyed, handle released");
  CHECK(vmmshim_residue(&r, sizeof r) == 0, "residue after the frees");
  d = &r.devices[0];
  CHECK(d->libraries == 2 * MiB && d->managed == 0 && d->graph == 0 && d->arrays == 0 && r.host_pinned == 1 * MiB,
        "what is left: vmm %llu managed %llu graph %llu arrays %llu host %llu", (unsigned long long)d->libraries,
        (unsigned long long)d->managed, (unsigned long long)d->graph, (unsigned long long)d->arrays,
        (unsigned long long)r.host_pinned);
  CHECK(d->unexplained == 0 && d->used == emu_device_used(0), "still exact: unexplained %lld",
        (long long)d->unexplained);
  helper_vmm_free(&b);
  helper_pinned_free(pin2);
  CHECK(vmmshim_wake("weights", 0, NULL, 0) == 0, "wake");
  cudaFree(w);
  cudaFree(k);
  CHECK(emu_violations() == 0, "no contract violation: %d", emu_violations());
}

static void scenario_growth(void) {
  void *w = tagged("weights", 8 * MiB);
  helper_vmm_t leak[3];
  for (int c = 0; c < 3; c++) {
    CHECK(helper_vmm_make(2 * MiB, 0, 0, &leak[c]) == 0, "cycle %d: the helper keeps 2 MiB more", c);
    CHECK(sleep_tag("weights") == 0, "cycle %d: sleep", c);
    CHECK(vmmshim_wake("weights", 0, NULL, 0) == 0, "cycle %d: wake", c);
  }
  vmmshim_residue_t r;
  CHECK(vmmshim_residue(&r, sizeof r) == 0 && r.seq == 3, "three sleeps: %llu", (unsigned long long)r.seq);
  CHECK(r.devices[0].growth == (int64_t)(4 * MiB) + (int64_t)(8 * MiB), "awake now: 8 MiB of weights and the 4 "
        "MiB the helper kept since the first sleep: %lld", (long long)r.devices[0].growth);
  CHECK(r.nsites >= 1 && r.sites[0].growth == (int64_t)(4 * MiB) && !strcmp(r.sites[0].lib, "libresidue_helper.so"),
        "the site that grew first: %s %lld", r.nsites ? r.sites[0].lib : "-",
        r.nsites ? (long long)r.sites[0].growth : 0ll);
  for (int c = 0; c < 3; c++) helper_vmm_free(&leak[c]);
  cudaFree(w);
}

static void scenario_trace(void) {
  void *w = tagged("weights", 8 * MiB);
  helper_vmm_t a;
  CHECK(helper_vmm_make(4 * MiB, 0, 0, &a) == 0, "the helper maps 4 MiB");
  void *pin = helper_pinned(1 * MiB);
  CHECK(sleep_tag("weights") == 0, "sleep");
  helper_vmm_free(&a);
  helper_pinned_free(pin);
  cudaFree(w);
}

/* One request over the control channel; the reply into buf. */
static int ctl_request(const char *req, char *buf, size_t cap) {
  int fd = ctl_connect(getpid(), geteuid());
  if (fd < 0) return -1;
  if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) return -1;
  size_t got = 0;
  while (got < cap - 1) {
    ssize_t k = read(fd, buf + got, cap - 1 - got);
    if (k <= 0) break;
    got += (size_t)k;
    if (buf[got - 1] == '\n') break;
  }
  buf[got] = 0;
  close(fd);
  return (int)got;
}

static void scenario_ctl(void) {
  void *w = tagged("weights", 8 * MiB);
  helper_vmm_t a;
  CHECK(helper_vmm_make(6 * MiB, 0, 0, &a) == 0, "the helper maps 6 MiB");
  void *pin = helper_pinned(2 * MiB);
  CHECK(sleep_tag("weights") == 0, "sleep");
  static char buf[1 << 16];
  CHECK(ctl_request("{\"v\":1,\"cmd\":\"residue\"}\n", buf, sizeof buf) > 0, "a reply");
  CHECK(strstr(buf, "\"ok\":true") != NULL, "done: %.200s", buf);
  CHECK(strstr(buf, "\"libraries\":6291456") != NULL, "the helper's VMM bytes: %.400s", buf);
  CHECK(strstr(buf, "\"unexplained\":0") != NULL, "nothing unexplained");
  CHECK(strstr(buf, "{\"name\":\"libresidue_helper.so\",\"vmm\":6291456,\"managed\":0,\"host\":2097152,\"arrays\":0}") != NULL,
        "the helper named with its bytes");
  CHECK(strstr(buf, "\"sleeps\":1") != NULL, "one sleep");
  CHECK(ctl_request("{\"v\":1,\"cmd\":\"status\"}\n", buf, sizeof buf) > 0, "status");
  CHECK(strstr(buf, "\"outside\":{\"vmm\":6291456,\"managed\":0,\"host\":2097152}") != NULL, "status counts it");
  CHECK(ctl_request("{\"v\":1,\"cmd\":\"nosuch\"}\n", buf, sizeof buf) > 0 && strstr(buf, "residue") != NULL,
        "the unknown-verb message lists residue");
  helper_vmm_free(&a);
  helper_pinned_free(pin);
  vmmshim_wake("weights", 0, NULL, 0);
  cudaFree(w);
}

static void fill(CUdeviceptr va, size_t n, unsigned char seed) {
  unsigned char *p = (unsigned char *)(uintptr_t)va;
  for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)(seed + i / 4096);
}
static bool same(CUdeviceptr va, size_t n, unsigned char seed) {
  const unsigned char *p = (const unsigned char *)(uintptr_t)va;
  for (size_t i = 0; i < n; i += 4096)
    if (p[i] != (unsigned char)(seed + i / 4096)) return false;
  return true;
}

/* VMMSHIM_SLEEP_FOREIGN=libresidue_helper*: the helper's own handle sleeps and wakes with every tag. */
static void scenario_foreign(void) {
  void *w = tagged("weights", 8 * MiB);
  helper_vmm_t a, b, c;
  CHECK(helper_vmm_make(6 * MiB, 0, 0, &a) == 0 && helper_vmm_make(2 * MiB, 0, 1, &b) == 0 &&
            helper_vmm_make_halves(4 * MiB, 0, &c) == 0, "the helper maps 6 MiB, 2 MiB exportable, 4 MiB in halves");
  CUmemGenericAllocationHandle own = own_handle(2 * MiB); /* the program's: not named by the option */
  fill(a.va, a.size, 7);
  fill(b.va, b.size, 9);
  emu_counters_t before = emu_now();
  size_t used_before = emu_device_used(0);
  vmmshim_sleep_result_t r;
  CHECK(vmmshim_sleep("weights", VMMSHIM_SLEEP_HOST, &r, sizeof r) == 0 && emu_host_mapped(a.va) == 0,
        "a sleep of one tag leaves the helper's memory");
  CHECK(vmmshim_wake("weights", 0, NULL, 0) == 0, "wake weights");
  long long dtoh = emu_calls("cuMemcpyDtoH"), htod = emu_calls("cuMemcpyHtoD");
  CHECK(vmmshim_sleep(NULL, VMMSHIM_SLEEP_HOST, &r, sizeof r) == 0, "sleep every tag: %s", r.reason);
  CHECK(emu_calls("cuMemcpyDtoH") == dtoh, "the helper's bytes went to the shim's host buffers, not through "
        "pageable memory (%lld cuMemcpyDtoH)", emu_calls("cuMemcpyDtoH") - dtoh);
  CHECK(emu_host_mapped(a.va) == -1 && emu_host_mapped(b.va) == 0 && emu_host_mapped(c.va) == 0,
        "the helper's plain handle left the device; the exportable one and the one in halves stayed (%d %d %d)",
        emu_host_mapped(a.va), emu_host_mapped(b.va), emu_host_mapped(c.va));
  CHECK(r.released == 14 * MiB && r.to_host == 14 * MiB, "released the tag's 8 MiB and the helper's 6: %llu, %llu",
        (unsigned long long)r.released, (unsigned long long)r.to_host);
  CHECK(r.skipped == 6 * MiB && strstr(r.reason, "exportable") && strstr(r.reason, "in pieces"),
        "skipped 6 MiB with the reasons: %llu '%s'", (unsigned long long)r.skipped, r.reason);
  emu_counters_t mid = emu_now();
  CHECK(mid.handle_bytes == before.handle_bytes && emu_device_used(0) + 14 * MiB == used_before,
        "the device holds the tag's and the helper's 14 MiB less, both now in host-location handles: handles "
        "%llu -> %llu, device %zu -> %zu", before.handle_bytes, mid.handle_bytes, used_before, emu_device_used(0));
  vmmshim_residue_t res;
  CHECK(vmmshim_residue(&res, sizeof res) == 0 && res.devices[0].libraries == 8 * MiB &&
            res.devices[0].unexplained == 0, "the residue: 8 MiB of libraries stayed, nothing unexplained (%llu, %lld)",
        (unsigned long long)res.devices[0].libraries, (long long)res.devices[0].unexplained);
  CHECK(vmmshim_wake(NULL, 0, &r, sizeof r) == 0 && r.restored == 14 * MiB, "wake every tag: restored %llu",
        (unsigned long long)r.restored);
  unsigned access = 0;
  CHECK(emu_host_mapped(a.va) == 0 && emu_handle_info(a.va, NULL, NULL, &access) == 0 &&
            access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "mapped again with its access (0x%x)", access);
  CHECK(same(a.va, a.size, 7) && same(b.va, b.size, 9), "every byte back");
  CHECK(emu_calls("cuMemcpyHtoD") == htod, "and back from them (%lld cuMemcpyHtoD)", emu_calls("cuMemcpyHtoD") - htod);
  /* Without host VMM the bytes go through pageable memory, and still come back. */
  emu_set_host_vmm(0);
  fill(a.va, a.size, 4);
  dtoh = emu_calls("cuMemcpyDtoH");
  CHECK(vmmshim_sleep(NULL, VMMSHIM_SLEEP_HOST, &r, sizeof r) == 0 && emu_host_mapped(a.va) == -1 &&
            emu_calls("cuMemcpyDtoH") == dtoh + 1, "without host VMM: copied through pageable memory (%s)", r.reason);
  CHECK(vmmshim_wake(NULL, 0, &r, sizeof r) == 0 && same(a.va, a.size, 4), "and back");
  emu_set_host_vmm(1);
  /* Asleep again, the library unmaps and releases it: done by the shim; the wake maps nothing. */
  CHECK(vmmshim_sleep(NULL, VMMSHIM_SLEEP_HOST, &r, sizeof r) == 0 && emu_host_mapped(a.va) == -1, "asleep again");
  CHECK(helper_vmm_free(&a) == 0, "the library frees its memory while it sleeps");
  CHECK(vmmshim_wake(NULL, 0, &r, sizeof r) == 0 && emu_host_mapped(a.va) == -1, "the wake maps nothing there");
  CHECK(helper_vmm_free(&b) == 0 && helper_vmm_free_halves(&c) == 0 && cuMemRelease(own) == CUDA_SUCCESS,
        "the rest freed");
  /* Two handles back to back, opened by one cuMemSetAccess: both sleep and wake; one cuMemUnmap
   * over both while they sleep is done by the shim. */
  helper_vmm_t pair[2];
  CHECK(helper_vmm_make_pair(2 * MiB, 0, pair) == 0, "the helper maps two handles back to back");
  fill(pair[0].va, 4 * MiB, 5);
  CHECK(vmmshim_sleep(NULL, VMMSHIM_SLEEP_HOST, &r, sizeof r) == 0 && emu_host_mapped(pair[0].va) == -1 &&
            emu_host_mapped(pair[1].va) == -1 && r.skipped == 0, "both left the device (skipped %llu: %s)",
        (unsigned long long)r.skipped, r.reason);
  CHECK(vmmshim_wake(NULL, 0, &r, sizeof r) == 0 && same(pair[0].va, 4 * MiB, 5), "both back with their bytes");
  CHECK(vmmshim_sleep(NULL, VMMSHIM_SLEEP_HOST, &r, sizeof r) == 0 && helper_vmm_free_pair(pair) == 0,
        "unmapped by one call and released while asleep");
  CHECK(vmmshim_wake(NULL, 0, &r, sizeof r) == 0 && emu_host_mapped(pair[0].va) == -1, "nothing mapped there");
  /* Woken once, freed by its old handle value. */
  CHECK(helper_vmm_make(4 * MiB, 0, 0, &a) == 0, "a new handle");
  fill(a.va, a.size, 3);
  CHECK(vmmshim_sleep(NULL, VMMSHIM_SLEEP_DISCARD, &r, sizeof r) == 0 && r.discarded >= 4 * MiB, "discarded");
  CHECK(vmmshim_wake(NULL, 0, &r, sizeof r) == 0 && emu_host_mapped(a.va) == 0, "woken (bytes undefined)");
  CHECK(helper_vmm_free(&a) == 0, "freed by the handle value the library had");
  cudaFree(w);
  CHECK(vmmshim_residue(&res, sizeof res) == 0 && res.devices[0].libraries == 0 &&
            res.devices[0].used == res.devices[0].tags, "nothing of the helper left: used %llu = the pools' %llu",
        (unsigned long long)res.devices[0].used, (unsigned long long)res.devices[0].tags);
  CHECK(emu_violations() == 0, "no contract violation: %d", emu_violations());
}

/* Without the option, a sleep of every tag leaves the helper's memory. */
static void scenario_foreign_off(void) {
  helper_vmm_t a;
  void *w = tagged("weights", 2 * MiB);
  CHECK(helper_vmm_make(6 * MiB, 0, 0, &a) == 0, "the helper maps 6 MiB");
  vmmshim_sleep_result_t r;
  CHECK(vmmshim_sleep(NULL, VMMSHIM_SLEEP_HOST, &r, sizeof r) == 0 && emu_host_mapped(a.va) == 0 &&
            r.released == 2 * MiB, "only the tag slept (%llu)", (unsigned long long)r.released);
  vmmshim_wake(NULL, 0, NULL, 0);
  CHECK(helper_vmm_free(&a) == 0, "freed");
  cudaFree(w);
}

/* Contexts take 3 MiB and modules 1 MiB of the emulated device. The first context (made with
 * cuCtxCreate) has no context to read free memory in and no NVML: not measured, said in the note,
 * its 3 MiB unexplained. The primary context, retained while it is current, is measured, then each
 * module and library load; unloads and the end of a context give their figures back. */
static void scenario_context(void) {
  CUcontext first = NULL, primary = NULL, cur = NULL;
  CHECK(cuInit(0) == CUDA_SUCCESS && cuCtxCreate(&first, NULL, 0, 0) == CUDA_SUCCESS, "a context of our own");
  CHECK(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS, "the primary context, retained while ours is current");
  CHECK(cuCtxPushCurrent(primary) == CUDA_SUCCESS, "push the primary context");
  CHECK(cudaSetDevice(0) == cudaSuccess && cudaFree(0) == cudaSuccess, "the runtime on the primary context");
  void *w = tagged("weights", 4 * MiB);
  CUmodule m1 = NULL, m2 = NULL;
  CUlibrary lib = NULL;
  CHECK(cuModuleLoadData(&m1, "image one") == CUDA_SUCCESS && cuModuleLoadData(&m2, "image two") == CUDA_SUCCESS,
        "two modules in the primary context");
  CHECK(cuCtxPopCurrent(&cur) == CUDA_SUCCESS && cur == primary, "back to our context");
  CHECK(cuLibraryLoadData(&lib, "code", NULL, NULL, 0, NULL, NULL, 0) == CUDA_SUCCESS, "a library in our context");
  CHECK(cuCtxPushCurrent(primary) == CUDA_SUCCESS, "the primary context again");

  vmmshim_residue_t r;
  CHECK(vmmshim_residue(&r, sizeof r) == 0 && r.ndevices == 1, "residue: %d devices", r.ndevices);
  const vmmshim_residue_device_t *d = &r.devices[0];
  CHECK(d->used == emu_device_used(0) && d->used == 13 * MiB, "used %llu: 2 contexts, 3 modules, 4 MiB of pools",
        (unsigned long long)d->used);
  CHECK(d->context == 3 * MiB, "the primary context measured: %llu", (unsigned long long)d->context);
  CHECK(d->modules == 3 * MiB, "three loads measured: %llu", (unsigned long long)d->modules);
  CHECK(d->unexplained == (int64_t)(3 * MiB), "the first context unexplained: %lld", (long long)d->unexplained);
  CHECK(d->process == 0 && d->inferred == 0, "no NVML: process %llu, inferred %llu", (unsigned long long)d->process,
        (unsigned long long)d->inferred);
  CHECK(strstr(r.note, "1 context, 0 module loads without a free-memory figure") != NULL, "the note says so: %s",
        r.note);

  CHECK(cuModuleUnload(m2) == CUDA_SUCCESS, "unload a module");
  CHECK(vmmshim_residue(&r, sizeof r) == 0 && r.devices[0].modules == 2 * MiB, "its figure went: %llu",
        (unsigned long long)r.devices[0].modules);
  CHECK(cuCtxDestroy(first) == CUDA_SUCCESS, "our context ends, with its library");
  CHECK(vmmshim_residue(&r, sizeof r) == 0, "residue after");
  d = &r.devices[0];
  CHECK(d->used == 8 * MiB && d->used == emu_device_used(0), "used %llu", (unsigned long long)d->used);
  CHECK(d->context == 3 * MiB && d->modules == 1 * MiB && d->unexplained == 0,
        "context %llu, modules %llu (the library went with its context), unexplained %lld",
        (unsigned long long)d->context, (unsigned long long)d->modules, (long long)d->unexplained);
  CHECK(cuLibraryUnload(lib) == CUDA_SUCCESS && cuModuleUnload(m1) == CUDA_SUCCESS, "unloads");
  CHECK(vmmshim_residue(&r, sizeof r) == 0 && r.devices[0].modules == 0 && r.devices[0].unexplained == 0,
        "nothing left: modules %llu, unexplained %lld", (unsigned long long)r.devices[0].modules,
        (long long)r.devices[0].unexplained);
  /* A mipmapped array counts as an array: its levels, 512x512 and 256x256 floats. */
  CUDA_ARRAY3D_DESCRIPTOR md = {512, 512, 0, CU_AD_FORMAT_FLOAT, 1, 0};
  CUmipmappedArray mip = NULL;
  CHECK(cuMipmappedArrayCreate(&mip, &md, 2) == CUDA_SUCCESS, "a mipmapped array of 2 levels");
  CHECK(vmmshim_residue(&r, sizeof r) == 0 && r.devices[0].arrays == 1280 * 1024 && r.devices[0].unexplained == 0,
        "counted as an array: %llu, unexplained %lld", (unsigned long long)r.devices[0].arrays,
        (long long)r.devices[0].unexplained);
  CHECK(cuMipmappedArrayDestroy(mip) == CUDA_SUCCESS && vmmshim_residue(&r, sizeof r) == 0 &&
            r.devices[0].arrays == 0, "destroyed: %llu", (unsigned long long)r.devices[0].arrays);
  CHECK(cudaFree(w) == cudaSuccess && cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS, "free, release");
}

/* The runtime's first context (the primary context, no context current) made on another thread,
 * parked in the driver while other processes take 2 MiB more. */
static void *first_context(void *arg) {
  (void)arg;
  CHECK(cudaSetDevice(0) == cudaSuccess && cudaFree(0) == cudaSuccess, "the runtime's first context");
  return NULL;
}

/* With the emulation's NVML (opened by path before the shim asks for it): the first context is
 * measured by NVML's free memory, less what the other processes took meanwhile; the process's
 * NVML figure less every measured owner is the inferred part (the driver's own 2 MiB here); the
 * other processes' 5 then 7 MiB are theirs; nothing unexplained. */
static void scenario_nvml(void) {
  char path[600], self[512];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  self[n > 0 ? n : 0] = 0;
  snprintf(path, sizeof path, "%s/../emu/nvml/libnvidia-ml.so.1", dirname(self));
  CHECK(dlopen(path, RTLD_NOW | RTLD_GLOBAL) != NULL, "the emulation's NVML: %s", dlerror());
  emu_set_context_memory(3 * MiB, 1 * MiB);
  CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  emu_set_other_processes(0, 5 * MiB);
  emu_hold_next("cuDevicePrimaryCtxRetain");
  pthread_t t;
  CHECK(pthread_create(&t, NULL, first_context, NULL) == 0, "a thread makes the first context");
  CHECK(emu_wait_held(5000) == 1, "its primary retain is parked in the driver");
  emu_set_other_processes(0, 7 * MiB);
  emu_release_hold();
  pthread_join(t, NULL);
  CHECK(cudaSetDevice(0) == cudaSuccess, "this thread on device 0");
  void *w = tagged("weights", 4 * MiB);
  emu_take_driver_memory(0, 2 * MiB);
  vmmshim_residue_t r;
  CHECK(vmmshim_residue(&r, sizeof r) == 0 && r.ndevices == 1, "residue: %d devices", r.ndevices);
  const vmmshim_residue_device_t *d = &r.devices[0];
  CHECK(d->used == 16 * MiB && d->used == emu_device_used(0), "used %llu: 3 context, 4 pools, 2 driver, 7 others",
        (unsigned long long)d->used);
  CHECK(d->context == 3 * MiB, "the first context measured by NVML, the others' 2 MiB not counted: %llu",
        (unsigned long long)d->context);
  CHECK(d->others == 7 * MiB && r.others_known, "other processes %llu", (unsigned long long)d->others);
  CHECK(d->process == 9 * MiB && d->inferred == 2 * MiB, "this process by NVML %llu, inferred %llu",
        (unsigned long long)d->process, (unsigned long long)d->inferred);
  CHECK(d->unexplained == 0, "nothing unexplained: %lld", (long long)d->unexplained);
  CHECK(!strstr(r.note, "without a free-memory figure"), "nothing unmeasured: %s", r.note);
  CHECK(cudaFree(w) == cudaSuccess, "free");
}

static void run_scenario(const char *name) {
  if (!strcmp(name, "nvml")) {
    scenario_nvml();
    return;
  }
  if (!strcmp(name, "context")) {
    emu_set_context_memory(3 * MiB, 1 * MiB);
    scenario_context();
    return;
  }
  CHECK(cudaSetDevice(0) == cudaSuccess && cudaFree(0) == cudaSuccess, "context");
  if (!strcmp(name, "exact")) scenario_exact();
  else if (!strcmp(name, "growth")) scenario_growth();
  else if (!strcmp(name, "trace")) scenario_trace();
  else if (!strcmp(name, "ctl")) scenario_ctl();
  else if (!strcmp(name, "foreign")) scenario_foreign();
  else if (!strcmp(name, "foreign-off")) scenario_foreign_off();
  else CHECK(0, "unknown scenario %s", name);
}

/* The trace the "trace" child wrote. */
static void check_trace(const char *path) {
  FILE *f = fopen(path, "r");
  CHECK(f != NULL, "trace %s", path);
  if (!f) return;
  char line[512];
  int made = 0, freed = 0, host = 0, unexplained = -1, named = 0, owners = 0;
  bool v4 = false;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "v 4 ", 4)) v4 = true;
    unsigned long long t, tid, kind, key, size, caller, stack, seq, bytes, lib;
    char dev[8], name[64];
    if (line[0] == 'u' && sscanf(line, "u %llx %llx %llx %7s %llx %llx %llx %llx", &t, &tid, &kind, dev, &key, &size,
                                 &caller, &stack) == 8) {
      if (kind == 0 && size == 4 * MiB && caller) made++;
      if (kind == 1 && size == 4 * MiB) freed++;
      if (kind == 4 && size == 1 * MiB) host++;
    }
    if (line[0] == 'r' && sscanf(line, "r %llx %llx %llx %7s %llx %63s", &t, &tid, &kind, dev, &lib, name) == 6 &&
        kind == 15 && !strcmp(name, "libresidue_helper.so"))
      named++;
    else if (line[0] == 'r' && sscanf(line, "r %llx %llx %llx %7s %llx %llx %llx", &t, &tid, &kind, dev, &seq, &bytes,
                                      &lib) == 7) {
      owners++;
      if (kind == 8) unexplained = (int)bytes;
    }
  }
  fclose(f);
  CHECK(v4, "format version 4");
  CHECK(made == 1 && freed == 1 && host == 1, "u records: made %d, freed %d, pinned %d", made, freed, host);
  CHECK(named == 1 && owners >= 8, "r records: the helper named %d, figures %d", named, owners);
  CHECK(unexplained == 0, "unexplained 0 in the trace: %d", unexplained);
}

int main(int argc, char **argv) {
  g_self = argv[0];
  const char *child = check_child_main(argc, argv);
  if (child) {
    run_scenario(child);
    return check_child_summary(child);
  }
  CHECK(vmmshim_api_version && vmmshim_api_version() >= 5, "the shim is preloaded, API version %d",
        vmmshim_api_version ? vmmshim_api_version() : -1);
  if (!vmmshim_api_version) return check_summary();
  check_run_child("exact", NULL);
  check_run_child("growth", NULL);
  const char *grew = strstr(check_child_output, "libresidue_helper.so+0x");
  CHECK(strstr(check_child_output, "residue: device 0 holds") != NULL && grew != NULL &&
            strspn(grew + 23, "0123456789abcdef") <= 5 && !strncmp(grew + 23 + strspn(grew + 23, "0123456789abcdef"),
                                                                   " (helper_", 9),
        "the growth is warned about, with the site that grew: its offset and symbol (%.80s)", grew ? grew : "-");
  char path[64], env[96];
  snprintf(path, sizeof path, "/tmp/vmmshim-residue-%d.trace", (int)getpid());
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path);
  check_run_child("trace", env, NULL);
  check_trace(path);
  unlink(path);
  check_run_child("ctl", NULL);
  check_run_child("context", NULL);
  check_run_child("nvml", NULL);
  check_run_child("foreign", "VMMSHIM_SLEEP_FOREIGN=libnccl*,libresidue_helper*", NULL);
  check_run_child("foreign-off", NULL);
  check_run_child("foreign-off", "VMMSHIM_SLEEP_FOREIGN=libnccl*", NULL);
  check_run_child("foreign-off", "VMMSHIM_SLEEP_FOREIGN=lib nccl", NULL);
  CHECK(strstr(check_child_output, "VMMSHIM_SLEEP_FOREIGN='lib nccl' is not valid") != NULL &&
            strstr(check_child_output, "using the default none") != NULL,
        "a malformed VMMSHIM_SLEEP_FOREIGN is said, and none is used");
  return check_summary();
}
