/* Host emulation of the few NVML calls the shim makes (libnvidia-ml.so.1), for the CPU tests of
 * the residue. It is built in a folder no search path names: a test that wants it opens it by its path before the
 * shim first asks for NVML, and the shim's dlopen("libnvidia-ml.so.1") then finds it loaded.
 *
 * Devices are found by the emulated driver's PCI bus ids ("0000:0N:00.0", device N - 1). A device's
 * free memory is the emulated driver's (every process's use, emu_set_other_processes included);
 * its processes are this one (its use less the other processes') and, when emu_set_other_processes
 * gave some, one other pid holding those bytes. Return codes: 0 success, 1 uninitialised, 2 invalid
 * argument, 7 insufficient size (count set to what is needed). */
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "emu.h"

#define API __attribute__((visibility("default")))

typedef struct {
  unsigned long long total, free, used;
} emu_nvml_memory_t;
typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} emu_nvml_proc_t;

static int g_nvml_up;

API int nvmlInit_v2(void) {
  g_nvml_up = 1;
  return 0;
}

API int nvmlShutdown(void) {
  g_nvml_up = 0;
  return 0;
}

static int device_of(void *h) { return (int)(uintptr_t)h - 1; }

API int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **out) {
  unsigned domain = 0, n = 0;
  if (!g_nvml_up) return 1;
  if (!bus || !out || sscanf(bus, "%x:%x:00.0", &domain, &n) != 2 || n == 0 || !emu_device_total((int)n - 1)) return 2;
  *out = (void *)(uintptr_t)n;
  return 0;
}

API int nvmlDeviceGetMemoryInfo(void *h, emu_nvml_memory_t *m) {
  if (!g_nvml_up) return 1;
  int dev = device_of(h);
  size_t total = emu_device_total(dev), used = emu_device_used(dev);
  if (!m || !total) return 2;
  m->total = total;
  m->used = used;
  m->free = used < total ? total - used : 0;
  return 0;
}

API int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, emu_nvml_proc_t *procs) {
  if (!g_nvml_up) return 1;
  int dev = device_of(h);
  if (!count || !emu_device_total(dev)) return 2;
  size_t others = emu_other_processes(dev), used = emu_device_used(dev);
  unsigned int n = others ? 2 : 1;
  if (*count < n || !procs) {
    *count = n;
    return 7;
  }
  procs[0] = (emu_nvml_proc_t){(unsigned int)getpid(), used - others, ~0u, ~0u};
  if (others) procs[1] = (emu_nvml_proc_t){(unsigned int)getpid() + 100000u, others, ~0u, ~0u};
  *count = n;
  return 0;
}
