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

static pthread_once_t vs_nvml_once = PTHREAD_ONCE_INIT;
static vs_nvml_by_pci_fn vs_nvml_by_pci;
static vs_nvml_procs_fn vs_nvml_procs;
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
  unsigned int me = (unsigned int)getpid();
  bool all = true;
  for (int i = 0; i < r->ndevices; i++) {
    char bus[32];
    void *dev = NULL;
    vs_nvml_proc_t p[VS_NVML_PROCS];
    unsigned int n = VS_NVML_PROCS;
    if (_vs_cu.cuDeviceGetPCIBusId(bus, sizeof bus, r->devices[i].device) != CUDA_SUCCESS ||
        vs_nvml_by_pci(bus, &dev) != 0 || vs_nvml_procs(dev, &n, p) != 0) {
      all = false;
      continue;
    }
    uint64_t others = 0;
    for (unsigned int k = 0; k < n && k < VS_NVML_PROCS; k++)
      if (p[k].pid != me && p[k].used != ~0ull) others += p[k].used;
    r->devices[i].others = others;
  }
  return all;
}
