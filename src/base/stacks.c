/* stacks.c: call stacks of traced allocations (VMMSHIM_TRACE_STACKS=N).
 *
 * On an allocation that is sampled (every one of VMMSHIM_TRACE_STACKS_MIN bytes or more, one in
 * VMMSHIM_TRACE_STACKS_SAMPLE below), the calling thread's native return addresses are taken
 * by the unwinder (libunwind when the process can load libunwind.so.8, the fastest exact one;
 * else libgcc's DWARF unwinder; or frame pointers, on request: docs/rationale.md), the
 * shim's own frames dropped, and its Python frames added when it holds the GIL (pyframes.c).
 * The stack is looked up in a hash table of the stacks seen: a known stack costs one hash and
 * one compare, with no lock; a new one is copied, given the next id and published under a
 * mutex, together with the modules its addresses lie in (dl_iterate_phdr: path, range, load
 * bias, build id) so the report can symbolise them after the process is gone.
 *
 * Nothing here runs unless VMMSHIM_TRACE_STACKS is set; the allocation path tests one global. */
#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/base.h"
#include "vmmshim/stacks.h"

int _vs_stacks_on;

static unsigned vs_depth;     /* native and Python frames kept, each */
static uint64_t vs_min_size;  /* allocations this large always get a stack */
static unsigned vs_sample;    /* one in vs_sample smaller ones does */
static bool vs_python;        /* Python frames wanted and CPython present */
static uintptr_t vs_self_lo, vs_self_hi;   /* the shim's own text: its frames are dropped */
static uintptr_t vs_unw_lo, vs_unw_hi;     /* the unwinder's, likewise */
static vs_lock_t vs_stacks_lock = VS_LOCK_INITIALIZER(VS_RANK_STACKS, "stacks");

/* ------------------------------------------------------------------ unwinders */

typedef int (*vs_unwind_fn)(void **buf, int max);
static vs_unwind_fn vs_unwind;

/* libgcc's unwinder, through _Unwind_Backtrace (found with dlsym). */
typedef enum { VS_URC_NO_REASON = 0, VS_URC_END_OF_STACK = 5 } vs_urc_t;
typedef vs_urc_t (*vs_trace_cb)(void *ctx, void *arg);
static int (*vs_unwind_backtrace)(vs_trace_cb, void *);
static uintptr_t (*vs_unwind_getip)(void *ctx);

typedef struct vs_walk_s {
  void **buf;
  int n, max;
} vs_walk_t;

static vs_urc_t dwarf_step(void *ctx, void *arg) {
  vs_walk_t *w = arg;
  if (w->n >= w->max) return VS_URC_END_OF_STACK;
  uintptr_t ip = vs_unwind_getip(ctx);
  if (!ip) return VS_URC_END_OF_STACK;
  w->buf[w->n++] = (void *)ip;
  return VS_URC_NO_REASON;
}

static int dwarf_unwind(void **buf, int max) {
  vs_walk_t w = {buf, 0, max};
  vs_unwind_backtrace(dwarf_step, &w);
  return w.n;
}

/* Frame pointers: as far as the chain stays inside the thread's stack and goes up. Correct
 * only through code built with frame pointers; the others cut the walk short. */
static _Thread_local uintptr_t tl_stack_lo, tl_stack_hi;

static __attribute__((noinline)) int fp_unwind(void **buf, int max) {
  if (!tl_stack_hi) {
    pthread_attr_t at;
    void *addr;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &at) != 0) return 0;
    pthread_attr_getstack(&at, &addr, &size);
    pthread_attr_destroy(&at);
    tl_stack_lo = (uintptr_t)addr;
    tl_stack_hi = (uintptr_t)addr + size;
  }
  uintptr_t *fp = __builtin_frame_address(0);
  int n = 0;
  while (n < max && (uintptr_t)fp >= tl_stack_lo && (uintptr_t)fp + 16 <= tl_stack_hi && !((uintptr_t)fp & 7)) {
    uintptr_t ret = fp[1], next = fp[0];
    if (!ret) break;
    buf[n++] = (void *)ret;
    if (next <= (uintptr_t)fp) break;
    fp = (uintptr_t *)next;
  }
  return n;
}

/* The address range of the loaded object that holds `addr`. */
static bool object_range(const void *addr, uintptr_t *lo, uintptr_t *hi);

static const char *pick_unwinder(const char *want) {
  bool any = !strcmp(want, "auto");
  if (any || !strcmp(want, "libunwind")) {
    void *lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    void *fn = lib ? _vs_real_dlsym(lib, "unw_backtrace") : NULL;
    if (fn) {
      /* Its per-thread cache of frame descriptions: threads never share a lock to unwind. */
      int (*set_policy)(void *, int) = (int (*)(void *, int))_vs_real_dlsym(lib, "_ULx86_64_set_caching_policy");
      void **space = (void **)_vs_real_dlsym(lib, "_ULx86_64_local_addr_space");
      if (set_policy && space) set_policy(*space, 2 /* UNW_CACHE_PER_THREAD */);
      vs_unwind = (vs_unwind_fn)fn;
      object_range(fn, &vs_unw_lo, &vs_unw_hi);
      return "libunwind";
    }
    if (!any) _vs_warn("VMMSHIM_TRACE_UNWIND=libunwind: cannot load libunwind.so.8 (Debian package libunwind8); using libgcc's");
  }
  if (any || strcmp(want, "fp")) {
    void *lib = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL);
    vs_unwind_backtrace = lib ? (int (*)(vs_trace_cb, void *))_vs_real_dlsym(lib, "_Unwind_Backtrace") : NULL;
    vs_unwind_getip = lib ? (uintptr_t(*)(void *))_vs_real_dlsym(lib, "_Unwind_GetIP") : NULL;
    if (vs_unwind_backtrace && vs_unwind_getip) {
      vs_unwind = dwarf_unwind;
      object_range((void *)vs_unwind_backtrace, &vs_unw_lo, &vs_unw_hi);
      return "dwarf (libgcc)";
    }
    _vs_warn("cannot load libgcc_s.so.1's unwinder; stacks are walked by frame pointers");
  }
  vs_unwind = fp_unwind;
  return "frame pointers";
}

static const char *unwind_name(void);

/* ------------------------------------------------------------------ modules */

size_t _vs_self_exe(char *buf, size_t cap) {
  ssize_t k = readlink("/proc/self/exe", buf, cap - 1);
  if (k < 0) k = 0;
  buf[k] = 0;
  return (size_t)k;
}

static vs_module_t vs_modules[VS_MODULES_MAX + 1]; /* [0] unused: id 0 is "no module" */
static atomic_uint vs_nmodules;                   /* ids 1 .. vs_nmodules are published */

const vs_module_t *_vs_module_get(uint32_t id) {
  return id && id <= atomic_load_explicit(&vs_nmodules, memory_order_acquire) ? &vs_modules[id] : NULL;
}

static void hex_of(const unsigned char *b, size_t n, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  for (size_t i = 0; i < n && o + 2 < cap; i++) {
    out[o++] = hex[b[i] >> 4];
    out[o++] = hex[b[i] & 15];
  }
  out[o] = 0;
}

/* The GNU build-id note among an object's PT_NOTE segments (in memory: no file is read). */
static void build_id(const struct dl_phdr_info *info, char *out, size_t cap) {
  out[0] = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE) continue;
    const char *p = (const char *)(info->dlpi_addr + ph->p_vaddr), *end = p + ph->p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
      const char *name = p + sizeof *nh, *desc = name + ((nh->n_namesz + 3) & ~3u);
      if (desc + nh->n_descsz > end) break;
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(name, "GNU", 4)) {
        hex_of((const unsigned char *)desc, nh->n_descsz, out, cap);
        return;
      }
      p = desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
}

static int module_of_locked(uintptr_t ip) {
  unsigned n = atomic_load_explicit(&vs_nmodules, memory_order_relaxed);
  for (unsigned i = 1; i <= n; i++)
    if (ip >= vs_modules[i].lo && ip < vs_modules[i].hi) return (int)i;
  return 0;
}

/* The addresses an object's loaded segments span: [*lo, *hi) (empty when it has none). */
static void load_extent(const struct dl_phdr_info *info, uintptr_t *lo, uintptr_t *hi) {
  *lo = UINTPTR_MAX;
  *hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if (a < *lo) *lo = a;
    if (a + ph->p_memsz > *hi) *hi = a + ph->p_memsz;
  }
}

static int add_module(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  (void)arg;
  uintptr_t lo, hi;
  load_extent(info, &lo, &hi);
  if (lo >= hi || module_of_locked(lo)) return 0;
  unsigned n = atomic_load_explicit(&vs_nmodules, memory_order_relaxed);
  if (n >= VS_MODULES_MAX) return 1;
  vs_module_t *m = &vs_modules[n + 1];
  m->lo = lo;
  m->hi = hi;
  m->bias = info->dlpi_addr;
  build_id(info, m->buildid, sizeof m->buildid);
  const char *name = info->dlpi_name;
  char exe[PATH_MAX];
  if (!name || !*name) { /* the main program */
    _vs_self_exe(exe, sizeof exe);
    name = exe;
  } else if (strstr(name, "linux-vdso") || strstr(name, "linux-gate")) {
    name = "[vdso]";
  }
  char *path = strdup(name);
  if (!path) return 1;
  for (char *c = path; *c; c++)
    if (*c == '\n') *c = ' ';
  m->path = path;
  atomic_store_explicit(&vs_nmodules, n + 1, memory_order_release);
  return 0;
}

/* The module holding ip; a miss rescans the loaded objects once (a library loaded since).
 * Stacks lock held. */
static uint16_t module_of(uintptr_t ip, bool *rescanned) {
  int id = module_of_locked(ip);
  if (!id && !*rescanned) {
    *rescanned = true;
    dl_iterate_phdr(add_module, NULL);
    id = module_of_locked(ip);
  }
  return (uint16_t)id;
}

struct range_arg {
  uintptr_t addr, lo, hi;
};

static int find_range(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  struct range_arg *r = arg;
  uintptr_t lo, hi;
  load_extent(info, &lo, &hi);
  if (r->addr >= lo && r->addr < hi) {
    r->lo = lo;
    r->hi = hi;
    return 1;
  }
  return 0;
}

static bool object_range(const void *addr, uintptr_t *lo, uintptr_t *hi) {
  struct range_arg r = {(uintptr_t)addr, 0, 0};
  dl_iterate_phdr(find_range, &r);
  *lo = r.lo;
  *hi = r.hi;
  return r.hi != 0;
}

/* ------------------------------------------------------------------ the stack table */

#define VS_STACK_SLOTS (1u << 16) /* twice VS_STACKS_MAX: probes stay short */
static vs_stack_t *_Atomic *vs_slots;
static vs_stack_t *_Atomic vs_by_id[VS_STACKS_MAX + 1];
static atomic_uint vs_nstacks;
static atomic_bool vs_full_said;

const vs_stack_t *_vs_stack_get(uint32_t id) {
  return id && id <= VS_STACKS_MAX ? atomic_load_explicit(&vs_by_id[id], memory_order_acquire) : NULL;
}

static uint64_t hash_stack(const uintptr_t *ips, int n, const vs_pyframe_t *py, int npy) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)(n * 131 + npy);
  for (int i = 0; i < n; i++) {
    h ^= ips[i];
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return npy ? _vs_hash_bytes(py, (size_t)npy * sizeof *py, h) : h;
}

static bool same(const vs_stack_t *s, uint64_t h, const uintptr_t *ips, int n, const vs_pyframe_t *py, int npy) {
  return s->hash == h && s->nnative == n && s->npy == npy && !memcmp(s->ips, ips, (size_t)n * sizeof *ips) &&
         (!npy || !memcmp(s->py, py, (size_t)npy * sizeof *py));
}

/* Lock-free lookup: entries are published once and never change. */
static uint32_t lookup(uint64_t h, const uintptr_t *ips, int n, const vs_pyframe_t *py, int npy) {
  for (uint32_t i = (uint32_t)h & (VS_STACK_SLOTS - 1);; i = (i + 1) & (VS_STACK_SLOTS - 1)) {
    vs_stack_t *s = atomic_load_explicit(&vs_slots[i], memory_order_acquire);
    if (!s) return 0;
    if (same(s, h, ips, n, py, npy)) return s->id;
  }
}

/* Stacks lock held. */
static uint32_t insert(uint64_t h, const uintptr_t *ips, int n, const vs_pyframe_t *py, int npy) {
  uint32_t id = lookup(h, ips, n, py, npy);
  if (id) return id;
  unsigned count = atomic_load_explicit(&vs_nstacks, memory_order_relaxed);
  if (count >= VS_STACKS_MAX) {
    if (!atomic_exchange(&vs_full_said, true))
      _vs_warn("trace: %d distinct stacks recorded; allocations from new ones get no stack", VS_STACKS_MAX);
    return 0;
  }
  size_t bytes = sizeof(vs_stack_t) + (size_t)n * (sizeof(uintptr_t) + sizeof(uint16_t)) + (size_t)npy * sizeof *py +
                 sizeof(uintptr_t);
  vs_stack_t *s = malloc(bytes);
  if (!s) return 0;
  uintptr_t *s_ips = (uintptr_t *)(s + 1);
  vs_pyframe_t *s_py = (vs_pyframe_t *)(s_ips + n);
  uint16_t *s_mod = (uint16_t *)(s_py + npy);
  memcpy(s_ips, ips, (size_t)n * sizeof *ips);
  if (npy) memcpy(s_py, py, (size_t)npy * sizeof *py);
  bool rescanned = false;
  for (int i = 0; i < n; i++) s_mod[i] = module_of(ips[i] - 1, &rescanned);
  s->hash = h;
  s->id = count + 1;
  s->nnative = (uint16_t)n;
  s->npy = (uint16_t)npy;
  s->ips = s_ips;
  s->modules = s_mod;
  s->py = s_py;
  atomic_store_explicit(&vs_by_id[s->id], s, memory_order_release);
  atomic_store_explicit(&vs_nstacks, count + 1, memory_order_relaxed);
  for (uint32_t i = (uint32_t)h & (VS_STACK_SLOTS - 1);; i = (i + 1) & (VS_STACK_SLOTS - 1))
    if (!atomic_load_explicit(&vs_slots[i], memory_order_relaxed)) {
      atomic_store_explicit(&vs_slots[i], s, memory_order_release);
      break;
    }
  return s->id;
}

/* ------------------------------------------------------------------ capture */

/* The shim's own frames above the program's (hook, alloc, trace, capture, unwinder: 5 or 6),
 * with room to spare: unwound, then dropped. */
#define VS_SHIM_FRAMES 8

/* How many frames at the top of a walk are the shim's own (or the unwinder's). */
static int own_frames(void *const *raw, int got) {
  int first = 0;
  while (first < got && (((uintptr_t)raw[first] >= vs_self_lo && (uintptr_t)raw[first] < vs_self_hi) ||
                         ((uintptr_t)raw[first] >= vs_unw_lo && (uintptr_t)raw[first] < vs_unw_hi)))
    first++;
  return first;
}

static _Thread_local unsigned tl_sample_count;
static _Thread_local int tl_in_python; /* reading this thread's Python frames */

uint32_t _vs_stack_capture(size_t requested) {
  if (requested < vs_min_size && (++tl_sample_count % vs_sample) != 0) return 0;
  void *raw[VS_STACK_FRAMES_MAX + VS_SHIM_FRAMES];
  int got = vs_unwind(raw, (int)vs_depth + VS_SHIM_FRAMES);
  /* Drop the shim's own frames (and the unwinder's) at the top of the stack. */
  int first = own_frames(raw, got);
  int n = got - first;
  if (n > (int)vs_depth) n = (int)vs_depth;
  const uintptr_t *ips = (const uintptr_t *)(raw + first);
  int token = vs_python && !tl_in_python ? _vs_pyframes_enter() : -1;
  if (token >= 0) {
    /* Reading frames can run Python's garbage collector, whose finalizers may free or even
     * allocate: such an allocation gets its native stack only. */
    tl_in_python = 1;
    vs_pyframe_t py[VS_STACK_FRAMES_MAX];
    _vs_lock_take(&vs_stacks_lock);
    int npy = _vs_pyframes(py, (int)vs_depth);
    uint32_t id = insert(hash_stack(ips, n, py, npy), ips, n, py, npy);
    _vs_lock_release(&vs_stacks_lock);
    _vs_pyframes_leave(token);
    tl_in_python = 0;
    return id;
  }
  uint64_t h = hash_stack(ips, n, NULL, 0);
  uint32_t id = lookup(h, ips, n, NULL, 0);
  if (vs_likely(id != 0)) return id;
  _vs_lock_take(&vs_stacks_lock);
  id = insert(h, ips, n, NULL, 0);
  _vs_lock_release(&vs_stacks_lock);
  return id;
}

void _vs_stacks_settings(unsigned *frames, uint64_t *min_size, unsigned *sample) {
  *frames = vs_depth;
  *min_size = vs_min_size;
  *sample = vs_sample;
}

void _vs_stacks_open(void) {
  unsigned depth = (unsigned)_vs_option(VS_OPT_TRACE_STACKS);
  if (!depth || _vs_option(VS_OPT_TRACE_FORMAT) == VS_TRACE_RMM) return; /* rmm has no stacks */
  if (_vs_stacks_on) return;
  vs_slots = calloc(VS_STACK_SLOTS, sizeof *vs_slots);
  if (!vs_slots || !_vs_strings_open()) {
    _vs_warn("trace: no memory for the stack table; the trace has no stacks");
    return;
  }
  vs_depth = depth;
  vs_min_size = _vs_option(VS_OPT_TRACE_STACKS_MIN);
  vs_sample = (unsigned)_vs_option(VS_OPT_TRACE_STACKS_SAMPLE);
  const char *unwinder = pick_unwinder(unwind_name());
  object_range((void *)_vs_stack_capture, &vs_self_lo, &vs_self_hi);
  vs_python = _vs_pyframes_open((int)_vs_option(VS_OPT_TRACE_PYTHON));
  _vs_lock_take(&vs_stacks_lock);
  dl_iterate_phdr(add_module, NULL);
  _vs_lock_release(&vs_stacks_lock);
  _vs_stacks_on = 1;
  _vs_info("trace: stacks of %u frames (unwinder %s%s), allocations of %llu bytes and more, one in %u below",
           depth, unwinder, !vs_python ? "" : _vs_pyframes_wait() ? ", Python frames" : ", Python frames of threads holding the GIL", (unsigned long long)vs_min_size, vs_sample);
}

/* ------------------------------------------------------------------ walks for tag rules */

static const char *unwind_name(void) {
  static const char *names[] = {"auto", "libunwind", "dwarf", "fp"};
  return names[_vs_option(VS_OPT_TRACE_UNWIND) & 3];
}

static pthread_once_t vs_walk_once = PTHREAD_ONCE_INIT;
static void walk_open(void) {
  if (!vs_unwind) pick_unwinder(unwind_name());
  if (!vs_self_hi) object_range((void *)_vs_stack_capture, &vs_self_lo, &vs_self_hi);
}

int _vs_stack_walk(void **out, int max) {
  pthread_once(&vs_walk_once, walk_open);
  void *raw[VS_STACK_FRAMES_MAX + VS_SHIM_FRAMES];
  if (max > VS_STACK_FRAMES_MAX) max = VS_STACK_FRAMES_MAX;
  int got = vs_unwind(raw, max + VS_SHIM_FRAMES);
  int first = own_frames(raw, got), n = got - first > max ? max : got - first;
  memcpy(out, raw + first, (size_t)(n > 0 ? n : 0) * sizeof *out);
  return n > 0 ? n : 0;
}
