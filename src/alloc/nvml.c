/* nvml.c: other processes' memory on the devices, from NVML, for the residue.
 *
 * NVML is opened with dlopen on the first residue (nothing is linked, and a process that never
 * asks for a residue never loads it); a device is found by its PCI bus id. Without NVML (the
 * emulation, a container without the library) the residue says so instead of guessing. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/alloc.h"

#define VS_NVML_PROCS 64

/* NVML's nvmlProcessInfo_t (nvmlDeviceGetComputeRunningProcesses_v3). */
typedef struct vs_nvml_proc_s {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} vs_nvml_proc_t;
typedef int (*vs_nvml_init_fn)(void);
typedef int (*vs_nvml_by_pci_fn)(const char *, void **);
typedef int (*vs_nvml_procs_fn)(void *, unsigned int *, vs_nvml_proc_t *);
typedef struct vs_nvml_memory_s { /* nvmlMemory_t */
  unsigned long long total, free, used;
} vs_nvml_memory_t;
typedef int (*vs_nvml_memory_fn)(void *, vs_nvml_memory_t *);

static pthread_once_t vs_nvml_once = PTHREAD_ONCE_INIT;
static vs_nvml_by_pci_fn vs_nvml_by_pci;
static vs_nvml_procs_fn vs_nvml_procs;
static vs_nvml_memory_fn vs_nvml_memory;
static char vs_nvml_error[96] = "NVML not read";

static void nvml_open(void) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(vs_nvml_error, sizeof vs_nvml_error, "NVML absent (libnvidia-ml.so.1 cannot be opened)");
    return;
  }
  vs_nvml_init_fn init = (vs_nvml_init_fn)_vs_real_dlsym(lib, "nvmlInit_v2");
  vs_nvml_by_pci_fn by_pci = (vs_nvml_by_pci_fn)_vs_real_dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  vs_nvml_procs_fn procs = (vs_nvml_procs_fn)_vs_real_dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
  int rc = init && by_pci && procs ? init() : -1;
  if (rc != 0) {
    snprintf(vs_nvml_error, sizeof vs_nvml_error, "NVML did not start (%s)", rc < 0 ? "functions missing" : "nvmlInit failed");
    return;
  }
  vs_nvml_by_pci = by_pci;
  vs_nvml_procs = procs;
  vs_nvml_memory = (vs_nvml_memory_fn)_vs_real_dlsym(lib, "nvmlDeviceGetMemoryInfo");
}

static void *nvml_device(int dev) {
  pthread_once(&vs_nvml_once, nvml_open);
  char bus[32];
  void *h = NULL;
  if (!vs_nvml_procs || !_vs_cu.cuDeviceGetPCIBusId || _vs_cu.cuDeviceGetPCIBusId(bus, sizeof bus, dev) != CUDA_SUCCESS ||
      vs_nvml_by_pci(bus, &h) != 0)
    return NULL;
  return h;
}

/* Our bytes and other processes' bytes on an NVML device. */
static bool nvml_split(void *dev, uint64_t *mine, uint64_t *others) {
  vs_nvml_proc_t p[VS_NVML_PROCS];
  unsigned int n = VS_NVML_PROCS;
  if (!dev || vs_nvml_procs(dev, &n, p) != 0) return false;
  unsigned int me = (unsigned int)getpid();
  *mine = *others = 0;
  for (unsigned int k = 0; k < n && k < VS_NVML_PROCS; k++)
    if (p[k].used != ~0ull) *(p[k].pid == me ? mine : others) += p[k].used;
  return true;
}

bool _vs_nvml_device_free(int dev, uint64_t *free_bytes) {
  void *h = nvml_device(dev);
  vs_nvml_memory_t m;
  if (!h || !vs_nvml_memory || vs_nvml_memory(h, &m) != 0) return false;
  *free_bytes = m.free;
  return true;
}

bool _vs_nvml_others_on(int dev, uint64_t *bytes) {
  uint64_t mine = 0;
  return nvml_split(nvml_device(dev), &mine, bytes);
}

/* Written once, by nvml_open: readers come after pthread_once. */
const char *_vs_nvml_why(void) {
  pthread_once(&vs_nvml_once, nvml_open);
  if (vs_nvml_procs && !_vs_cu.cuDeviceGetPCIBusId) return "the driver has no cuDeviceGetPCIBusId";
  return vs_nvml_procs ? "NVML did not answer for every device" : vs_nvml_error;
}

bool _vs_nvml_others(vmmshim_residue_t *r) {
  pthread_once(&vs_nvml_once, nvml_open);
  if (!vs_nvml_procs || !_vs_cu.cuDeviceGetPCIBusId) return false; /* _vs_nvml_why says why */
  bool all = true;
  for (int i = 0; i < r->ndevices; i++) {
    uint64_t mine = 0, others = 0;
    if (!nvml_split(nvml_device(r->devices[i].device), &mine, &others)) {
      all = false;
      continue;
    }
    r->devices[i].others = others;
    r->devices[i].process = mine; /* 0 where NVML does not list this pid (another pid namespace) */
  }
  return all;
}
