/* test_shim_stacks: call stacks in the trace (VMMSHIM_TRACE_STACKS), under the shim, one
 * process per scenario. The child allocates from three known functions (alloc_site_a, _b,
 * _c: 3, 5 and 7 allocations, through cudaMalloc, cuMemAlloc and cudaMallocAsync), exits, and
 * the parent reads the trace it wrote:
 *   - version 4 (the current format), a 't' line with the settings, 'l' lines naming this program (with its build
 *     id) before any stack uses it, one 'k' line per distinct stack, before the first
 *     allocation that refers to it;
 *   - every allocation of a site refers to one stack (deduplicated: one 'k' for N allocations);
 *     the innermost frame kept lies in the site's function (dladdr), no frame lies in the shim;
 *   - the same with each unwinder: libunwind (when the machine has it), dwarf (libgcc), fp;
 *   - VMMSHIM_TRACE_STACKS_MIN / _SAMPLE: large allocations always, one in K small ones;
 *   - stacks off: the 'a' lines end in 0, no 'k', 'l' or 't' line. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

/* ---------------------------------------------------------------- the child: three sites */
__attribute__((noinline)) void alloc_site_a(int n) {
  for (int i = 0; i < n; i++) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, MiB) == cudaSuccess, "site a");
  }
  __asm__ volatile("" ::: "memory"); /* the call stays a call, not a tail call */
}

__attribute__((noinline)) void alloc_site_b(int n) {
  for (int i = 0; i < n; i++) {
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc(&d, 3000) == CUDA_SUCCESS, "site b");
  }
  __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) void alloc_site_c(int n, cudaStream_t s) {
  for (int i = 0; i < n; i++) {
    void *p = NULL;
    CHECK(cudaMallocAsync(&p, 64 * KiB, s) == cudaSuccess, "site c");
  }
  __asm__ volatile("" ::: "memory");
}

static void child_sites(void) {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  alloc_site_a(3);
  alloc_site_b(5);
  alloc_site_c(7, s);
}

/* Many small allocations and a few large ones from one site: sampling. */
__attribute__((noinline)) void alloc_site_sampled(void) {
  for (int i = 0; i < 100; i++) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4 * KiB) == cudaSuccess, "small");
  }
  for (int i = 0; i < 4; i++) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, 2 * MiB) == cudaSuccess, "large");
  }
  __asm__ volatile("" ::: "memory");
}

/* ---------------------------------------------------------------- the parent: the trace */
typedef struct {
  unsigned long id;
  int nnative;
  unsigned long long ip[64];   /* as the child had them */
  unsigned long long here[64]; /* in this process: frames of this program moved by the load bias */
  int in_shim, unknown;        /* frames in the shim's module, frames in no written module */
} stack_t_;

typedef struct {
  char *text;
  stack_t_ stacks[64];
  int nstacks;
  int have_t, self_module, stack_before_use;
  int allocs, allocs_with_stack;
  unsigned long alloc_stack[256];
  unsigned long long alloc_size[256];
} trace_t;

static unsigned long long hx(const char *s) { return strtoull(s, NULL, 16); }

static char *slurp(const char *path) {
  static char buf[1 << 20];
  return check_read_file(path, buf, sizeof buf);
}

static const stack_t_ *find_stack(const trace_t *t, unsigned long id) {
  for (int i = 0; i < t->nstacks; i++)
    if (t->stacks[i].id == id) return &t->stacks[i];
  return NULL;
}

/* The rest of an 'l' line after its six fixed fields: the path. */
static const char *module_path(const char *l) {
  const char *p = l;
  for (int i = 0; i < 6 && p; i++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  return p ? p : "";
}

static void parse(trace_t *t, const char *path, const char *self) {
  memset(t, 0, sizeof *t);
  t->text = slurp(path);
  CHECK(t->text != NULL, "read %s", path);
  if (!t->text) return;
  CHECK(!strncmp(t->text, "v 4 vmmshim ", 12), "version 4: %.20s", t->text);
  struct { unsigned long long lo, hi, bias; int self, shim; } mods[64];
  int nmods = 0;
  Dl_info me;
  unsigned long long here_bias = dladdr((void *)parse, &me) ? (unsigned long long)(uintptr_t)me.dli_fbase : 0;
  char *save = NULL;
  static char copy[1 << 20];
  snprintf(copy, sizeof copy, "%s", t->text);
  t->stack_before_use = 1;
  for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    char *f[200];
    int k = 0;
    char *fs = NULL;
    char line[4096];
    snprintf(line, sizeof line, "%s", l);
    for (char *w = strtok_r(line, " ", &fs); w && k < 200; w = strtok_r(NULL, " ", &fs)) f[k++] = w;
    if (l[0] == 't') t->have_t = 1;
    if (l[0] == 'l' && k >= 7 && nmods < 64) {
      const char *p = module_path(l);
      mods[nmods].lo = hx(f[2]);
      mods[nmods].hi = hx(f[3]);
      mods[nmods].bias = hx(f[4]);
      mods[nmods].self = !strcmp(p, self);
      mods[nmods].shim = strstr(p, "libvmmshim") != NULL;
      if (mods[nmods].self && strcmp(f[5], "-") && strlen(f[5]) >= 16) t->self_module = 1;
      nmods++;
    }
    if (l[0] == 'k' && k >= 4 && t->nstacks < 64) {
      stack_t_ *s = &t->stacks[t->nstacks++];
      s->id = (unsigned long)hx(f[1]);
      s->nnative = (int)hx(f[2]);
      for (int i = 0; i < s->nnative && i < 64 && 4 + i < k; i++) {
        s->ip[i] = hx(f[4 + i]);
        int m = 0;
        while (m < nmods && !(s->ip[i] - 1 >= mods[m].lo && s->ip[i] - 1 < mods[m].hi)) m++;
        if (m == nmods) s->unknown++;
        else if (mods[m].shim) s->in_shim++;
        else if (mods[m].self) s->here[i] = s->ip[i] - mods[m].bias + here_bias;
      }
    }
    if (l[0] == 'a' && k == 10 && t->allocs < 256) {
      unsigned long id = (unsigned long)hx(f[9]);
      t->alloc_stack[t->allocs] = id;
      t->alloc_size[t->allocs] = hx(f[7]);
      t->allocs++;
      if (id) {
        t->allocs_with_stack++;
        if (!find_stack(t, id)) t->stack_before_use = 0;
      }
    }
  }
}

/* The innermost frame of this program in a stack that names a site function (dladdr here,
 * on the child's address moved by the difference of the two load biases). */
static const char *site_of(const stack_t_ *s) {
  for (int i = 0; i < s->nnative; i++) {
    Dl_info di;
    if (s->here[i] && dladdr((void *)(uintptr_t)(s->here[i] - 1), &di) && di.dli_sname &&
        !strncmp(di.dli_sname, "alloc_site_", 11))
      return di.dli_sname;
  }
  return "";
}

static void check_sites(const char *what, const char *path, const char *self) {
  trace_t *t = calloc(1, sizeof *t);
  parse(t, path, self);
  CHECK(t->have_t, "%s: 't' line", what);
  CHECK(t->self_module, "%s: an 'l' line names this program with a build id", what);
  CHECK(t->stack_before_use, "%s: every stack is written before the first allocation that refers to it", what);
  CHECK(t->allocs == 15 && t->allocs_with_stack == 15, "%s: 15 allocations, all with a stack (%d, %d)", what,
        t->allocs, t->allocs_with_stack);
  const char *want[3] = {"alloc_site_a", "alloc_site_b", "alloc_site_c"};
  int counts[3] = {3, 5, 7}, start = 0;
  for (int site = 0; site < 3; site++) {
    unsigned long id = t->alloc_stack[start];
    int same = 1;
    for (int i = start; i < start + counts[site]; i++) same &= t->alloc_stack[i] == id;
    CHECK(same, "%s: the %d allocations of %s refer to one stack", what, counts[site], want[site]);
    const stack_t_ *s = find_stack(t, id);
    CHECK(s && !strcmp(site_of(s), want[site]), "%s: stack %lu names %s (found '%s')", what, id, want[site],
          s ? site_of(s) : "no stack");
    CHECK(s && !s->in_shim, "%s: no frame of %s's stack lies in the shim", what, want[site]);
    CHECK(s && !s->unknown, "%s: every frame of %s's stack lies in a module written before it", what, want[site]);
    start += counts[site];
  }
  CHECK(t->nstacks == 3, "%s: 3 distinct stacks written, once each (%d)", what, t->nstacks);
  free(t);
}

static char g_dir[256];

static void run_sites(const char *what, const char *unwind) {
  char trace[512], env_trace[600], env_unwind[64];
  snprintf(trace, sizeof trace, "%s/%s.trace", g_dir, what);
  snprintf(env_trace, sizeof env_trace, "VMMSHIM_TRACE=%s", trace);
  snprintf(env_unwind, sizeof env_unwind, "VMMSHIM_TRACE_UNWIND=%s", unwind);
  check_run_child("sites", env_trace, "VMMSHIM_TRACE_STACKS=16", env_unwind, NULL);
  char self[1024];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  self[k > 0 ? k : 0] = 0;
  check_sites(what, trace, self);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(60);
    if (!strcmp(sc, "sites")) child_sites();
    else if (!strcmp(sc, "sampled")) alloc_site_sampled();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  snprintf(g_dir, sizeof g_dir, "/tmp/vmmshim-stacks-test-XXXXXX");
  if (!mkdtemp(g_dir)) return 1;
  int have_libunwind = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL) != NULL;
  if (have_libunwind) run_sites("libunwind", "libunwind");
  else printf("note: libunwind.so.8 is not on this machine: its run is left out\n");
  run_sites("dwarf", "dwarf");
  run_sites("auto", "auto");
  run_sites("fp", "fp");

  /* Sampling: 2 MiB and more always, one in 10 of the 4 KiB ones. */
  char trace[512], env_trace[600];
  snprintf(trace, sizeof trace, "%s/sampled.trace", g_dir);
  snprintf(env_trace, sizeof env_trace, "VMMSHIM_TRACE=%s", trace);
  check_run_child("sampled", env_trace, "VMMSHIM_TRACE_STACKS=8", "VMMSHIM_TRACE_STACKS_MIN=1M",
                  "VMMSHIM_TRACE_STACKS_SAMPLE=10", NULL);
  trace_t *t = calloc(1, sizeof *t);
  parse(t, trace, "");
  int small = 0, large = 0;
  for (int i = 0; i < t->allocs; i++) {
    if (t->alloc_size[i] == 4 * KiB) small += t->alloc_stack[i] != 0;
    if (t->alloc_size[i] == 2 * MiB) large += t->alloc_stack[i] != 0;
  }
  CHECK(t->allocs == 104 && small == 10 && large == 4, "sampling: %d allocations, %d of 100 small and %d of 4 large with a stack",
        t->allocs, small, large);
  CHECK(strstr(t->text, "\nt 8 100000 a\n") != NULL, "the 't' line says 8 frames, 1 MiB, one in 10");

  /* Stacks off: nothing of it in the trace. */
  snprintf(trace, sizeof trace, "%s/off.trace", g_dir);
  snprintf(env_trace, sizeof env_trace, "VMMSHIM_TRACE=%s", trace);
  check_run_child("sites", env_trace, NULL);
  parse(t, trace, "");
  CHECK(t->allocs == 15 && t->allocs_with_stack == 0 && t->nstacks == 0 && !t->have_t,
        "stacks off: 15 allocations, no stack, no 'k' or 't' line");
  CHECK(!strstr(t->text, "\nl "), "stacks off: no module line");
  free(t);
  if (!check_failed) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) printf("could not remove %s\n", g_dir);
  } else {
    printf("traces kept in %s\n", g_dir);
  }
  return check_summary();
}
