/* residue.c: what is still on the device after a sleep, and who owns it.
 *
 * A residue adds up, per device the process uses: what the driver says is in use (total - free,
 * cuMemGetInfo, every process's), the shim's pools (what awake tags hold and what sleeping ones
 * left), the VMM memory, managed memory and pinned host memory libraries made themselves
 * (outside.c, by library and call site), graph memory (the driver's graph-memory attribute),
 * other processes (nvml.c), and what none of these explain. One is computed after every sleep
 * (sleep.c calls _vs_residue_after_sleep): traced ('r' records), and compared with the one after
 * the first sleep, so memory that grows cycle after cycle is reported with the sites that grew.
 *
 * The figures are read without any lock of the shim held across a driver call: the driver is
 * asked first, then each table under its own lock; the baseline is kept under a leaf lock. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/alloc.h"
#include "vmmshim/stacks.h"

#define VS_RESIDUE_GROWTH_MIN (2ull << 20) /* growth of a device's use below this is not reported */

typedef struct vs_residue_base_s {
  bool set;
  uint64_t used[VMMSHIM_RESIDUE_DEVICES];
  int dev[VMMSHIM_RESIDUE_DEVICES];
  int ndev;
  uint64_t site[VS_OUTSIDE_SITES];
} vs_residue_base_t;

static vs_lock_t vs_residue_lock = VS_LOCK_INITIALIZER(VS_RANK_RESIDUE, "residue");
static vs_residue_base_t vs_base;
static uint64_t vs_seq;

/* ------------------------------------------------------------------ the devices */

typedef struct vs_res_ctx_s {
  int n;
  int dev[VMMSHIM_RESIDUE_DEVICES];
  CUcontext ctx[VMMSHIM_RESIDUE_DEVICES];
  uint64_t tags[VMMSHIM_RESIDUE_DEVICES];
} vs_res_ctx_t;

static int slot_of(vs_res_ctx_t *c, int dev) {
  for (int i = 0; i < c->n; i++)
    if (c->dev[i] == dev) return i;
  if (c->n == VMMSHIM_RESIDUE_DEVICES || dev < 0) return -1;
  c->dev[c->n] = dev;
  c->ctx[c->n] = NULL;
  c->tags[c->n] = 0;
  return c->n++;
}

static void add_pool(vs_pool_t *pool, void *arg) {
  vs_res_ctx_t *c = arg;
  int i = slot_of(c, _vs_pool_device(pool));
  if (i < 0) return;
  vs_sleep_figures_t f;
  _vs_pool_sleep_figures(pool, &f);
  c->tags[i] += f.device;
  if (!c->ctx[i]) c->ctx[i] = _vs_pool_context(pool);
}

/* The driver's figures for one device, in a context of it: a pool's, else its primary context
 * when it is active (none is made for this). false when none could be had. */
static bool measure(int dev, CUcontext ctx, vmmshim_residue_device_t *d) {
  bool primary = false;
  if (!ctx) {
    unsigned flags = 0;
    int active = 0;
    if (!_vs_cu.cuDevicePrimaryCtxGetState || _vs_cu.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS ||
        !active || _vs_cu.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
      return false;
    primary = true;
  }
  bool ok = false;
  if (_vs_cu.cuCtxPushCurrent(ctx) == CUDA_SUCCESS) {
    size_t fr = 0, tot = 0;
    ok = _vs_cu.cuMemGetInfo(&fr, &tot) == CUDA_SUCCESS;
    if (ok) {
      d->total = tot;
      d->free = fr;
      d->used = tot > fr ? tot - fr : 0;
    }
    cuuint64_t g = 0;
    if (_vs_cu.cuDeviceGetGraphMemAttribute &&
        _vs_cu.cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &g) == CUDA_SUCCESS)
      d->graph = g;
    CUcontext popped;
    _vs_cu.cuCtxPopCurrent(&popped);
  }
  if (primary) _vs_cu.cuDevicePrimaryCtxRelease(dev);
  return ok;
}

/* ------------------------------------------------------------------ owners */

static void add_outside(vmmshim_residue_t *r, const vs_outside_figures_t *of) {
  for (int i = 0; i < r->ndevices; i++) {
    vmmshim_residue_device_t *d = &r->devices[i];
    if (d->device < 0 || d->device >= VS_OUTSIDE_DEVICES) continue;
    d->libraries = of->dev[d->device][VS_OUTSIDE_VMM];
    d->managed = of->dev[d->device][VS_OUTSIDE_MANAGED];
    d->arrays = of->dev[d->device][VS_OUTSIDE_ARRAY];
  }
  r->host_pinned = of->host;
  r->shared = of->shared;
  /* The largest libraries and sites, by bytes of every kind. */
  bool taken[VS_OUTSIDE_SITES > VS_OUTSIDE_LIBS ? VS_OUTSIDE_SITES : VS_OUTSIDE_LIBS];
  memset(taken, 0, sizeof taken);
  for (r->nlibs = 0; r->nlibs < VMMSHIM_RESIDUE_LIBS; r->nlibs++) {
    int best = -1;
    uint64_t most = 0;
    for (int l = 0; l < of->nlibs; l++) {
      uint64_t n = 0;
      for (int k = 0; k < VS_OUTSIDE_KINDS; k++) n += of->libs[l].bytes[k];
      if (!taken[l] && n > most) best = l, most = n;
    }
    if (best < 0) break;
    taken[best] = true;
    vmmshim_residue_lib_t *o = &r->libs[r->nlibs];
    snprintf(o->name, sizeof o->name, "%s", of->libs[best].name);
    o->vmm = of->libs[best].bytes[VS_OUTSIDE_VMM];
    o->managed = of->libs[best].bytes[VS_OUTSIDE_MANAGED];
    o->host = of->libs[best].bytes[VS_OUTSIDE_HOST];
    o->arrays = of->libs[best].bytes[VS_OUTSIDE_ARRAY];
  }
}

/* Where a return address lies: its offset in its library (addresses differ from run to run and
 * process to process; offsets do not) and, where the library exports one, the symbol. */
static void locate(vmmshim_residue_site_t *o) {
  Dl_info di;
  o->offset = o->addr;
  if (!o->addr || !dladdr((void *)(uintptr_t)o->addr, &di)) return;
  o->offset = o->addr - (uintptr_t)di.dli_fbase;
  if (di.dli_sname && di.dli_saddr)
    snprintf(o->symbol, sizeof o->symbol, "%.40s+0x%llx", di.dli_sname,
             (unsigned long long)(o->addr - (uintptr_t)di.dli_saddr));
}

/* The sites, largest first; with a baseline, those that grew come first, by growth. */
static void add_sites(vmmshim_residue_t *r, const vs_outside_figures_t *of, const vs_residue_base_t *base) {
  bool taken[VS_OUTSIDE_SITES];
  memset(taken, 0, sizeof taken);
  for (r->nsites = 0; r->nsites < VMMSHIM_RESIDUE_SITES; r->nsites++) {
    int best = -1;
    int64_t best_growth = 0;
    uint64_t most = 0;
    for (int s = 0; s < of->nsites; s++) {
      if (taken[s] || !of->sites[s].bytes) continue;
      int64_t g = base->set ? (int64_t)(of->sites[s].bytes - base->site[s]) : 0;
      if (g > best_growth || (g == best_growth && of->sites[s].bytes > most)) best = s, best_growth = g, most = of->sites[s].bytes;
    }
    if (best < 0) break;
    taken[best] = true;
    const vs_outside_site_t *in = &of->sites[best];
    vmmshim_residue_site_t *o = &r->sites[r->nsites];
    snprintf(o->lib, sizeof o->lib, "%s", in->lib >= 0 ? of->libs[in->lib].name : "(other sites)");
    o->addr = in->addr;
    locate(o);
    o->stack = in->stack;
    const vs_stack_t *st = in->stack ? _vs_stack_get(in->stack) : NULL;
    if (st && st->npy) { /* the Python line that made it (VMMSHIM_TRACE_STACKS, pyframes.c) */
      const char *file = _vs_string_get(st->py[0].file), *func = _vs_string_get(st->py[0].func);
      snprintf(o->python, sizeof o->python, "%.60s:%u %.30s", file ? file : "?", st->py[0].line, func ? func : "?");
    }
    o->kind = in->kind;
    o->bytes = in->bytes;
    o->growth = best_growth;
  }
}

/* What this process's measured owners leave of its NVML figure is inferred to be the driver's:
 * with lazy loading, kernels load at their first launch, where no free memory is read. */
static void explain(vmmshim_residue_device_t *d) {
  uint64_t mine = d->tags + d->libraries + d->managed + d->graph + d->arrays + d->context + d->modules;
  d->inferred = d->process > mine ? d->process - mine : 0;
  d->unexplained = d->measured ? (int64_t)(d->used - mine - d->inferred - d->others) : 0;
}

/* ------------------------------------------------------------------ computing one */

static void compute(vmmshim_residue_t *r, vs_outside_figures_t *of) {
  memset(r, 0, sizeof *r);
  vs_res_ctx_t c = {0};
  _vs_visit_tag(-1, add_pool, &c);
  _vs_outside_figures(of);
  for (int d = 0; d < VS_OUTSIDE_DEVICES; d++)
    if (of->dev[d][VS_OUTSIDE_VMM] || of->dev[d][VS_OUTSIDE_MANAGED]) slot_of(&c, d);
  bool unmeasured = false;
  r->ndevices = c.n;
  for (int i = 0; i < c.n; i++) {
    vmmshim_residue_device_t *d = &r->devices[i];
    d->device = c.dev[i];
    d->tags = c.tags[i];
    d->measured = measure(c.dev[i], c.ctx[i], d);
    unmeasured |= !d->measured;
  }
  add_outside(r, of);
  r->others_known = _vs_nvml_others(r);
  unsigned missed_modules = 0, missed = 0;
  for (int i = 0; i < r->ndevices; i++) {
    missed = _vs_ctxmem_figures(r->devices[i].device, &r->devices[i].context, &r->devices[i].modules, &missed_modules);
    explain(&r->devices[i]);
  }
  if (unmeasured) snprintf(r->note, sizeof r->note, "a device without an active context was not measured");
  else if (!r->others_known) snprintf(r->note, sizeof r->note, "other processes: %s", _vs_nvml_why());
  if (of->untracked)
    snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note), "%s%llu bytes made outside the pools "
             "were not tracked (no room)", r->note[0] ? "; " : "", (unsigned long long)of->untracked);
  if (missed || missed_modules)
    snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note), "%s%u context%s, %u module load%s "
             "without a free-memory figure (not counted)", r->note[0] ? "; " : "", missed, missed == 1 ? "" : "s",
             missed_modules, missed_modules == 1 ? "" : "s");
}

/* Growth since the baseline (the residue after the first sleep), device by device. Lock held. */
static void growth(vmmshim_residue_t *r) {
  for (int i = 0; i < r->ndevices; i++)
    for (int b = 0; vs_base.set && b < vs_base.ndev; b++)
      if (vs_base.dev[b] == r->devices[i].device) r->devices[i].growth = (int64_t)(r->devices[i].used - vs_base.used[b]);
}

static void set_base(const vmmshim_residue_t *r, const vs_outside_figures_t *of) {
  vs_base.set = true;
  vs_base.ndev = r->ndevices;
  for (int i = 0; i < r->ndevices; i++) {
    vs_base.dev[i] = r->devices[i].device;
    vs_base.used[i] = r->devices[i].used;
  }
  for (int s = 0; s < of->nsites; s++) vs_base.site[s] = of->sites[s].bytes;
}

/* A residue, its growth since the baseline and its sites. One after a sleep is the next in
 * sequence, and the first sets the baseline. */
static void take(vmmshim_residue_t *r, vs_outside_figures_t *of, bool after_sleep) {
  compute(r, of);
  vs_residue_base_t base;
  _vs_lock_take(&vs_residue_lock);
  r->seq = after_sleep ? ++vs_seq : vs_seq;
  if (after_sleep && !vs_base.set) set_base(r, of);
  growth(r);
  base = vs_base;
  _vs_lock_release(&vs_residue_lock);
  add_sites(r, of, &base);
}

int _vs_residue(vmmshim_residue_t *out) {
  if (!_vs_active()) return -ENODEV;
  vs_outside_figures_t *of = malloc(sizeof *of);
  if (!of) return -ENOMEM;
  take(out, of, false);
  free(of);
  return 0;
}

/* ------------------------------------------------------------------ after a sleep */

static void trace_residue(const vmmshim_residue_t *r) {
  for (int i = 0; i < r->ndevices; i++) {
    const vmmshim_residue_device_t *d = &r->devices[i];
    const uint64_t v[] = {d->total, d->used, d->tags, 0, d->managed, d->graph, d->context, d->others,
                          (uint64_t)d->unexplained};
    for (int o = 0; o < (int)(sizeof v / sizeof v[0]); o++)
      if (o != VS_RESIDUE_LIBRARY && (d->measured || o >= VS_RESIDUE_TAGS)) _vs_trace_residue(o, d->device, r->seq, v[o], 0);
  }
  for (int l = 0; l < r->nlibs; l++) {
    _vs_trace_residue_name((unsigned)l + 1, r->libs[l].name);
    _vs_trace_residue(VS_RESIDUE_LIBRARY, -1, r->seq, r->libs[l].vmm, (unsigned)l + 1);
  }
  _vs_trace_residue(VS_RESIDUE_HOST, -1, r->seq, r->host_pinned, 0);
  for (int i = 0; i < r->ndevices; i++) {
    const vmmshim_residue_device_t *d = &r->devices[i];
    if (d->arrays) _vs_trace_residue(VS_RESIDUE_ARRAYS, d->device, r->seq, d->arrays, 0);
    _vs_trace_residue(VS_RESIDUE_MODULES, d->device, r->seq, d->modules, 0);
    if (d->process) {
      _vs_trace_residue(VS_RESIDUE_PROCESS, d->device, r->seq, d->process, 0);
      _vs_trace_residue(VS_RESIDUE_INFERRED, d->device, r->seq, d->inferred, 0);
    }
  }
}

static void warn_growth(const vmmshim_residue_t *r) {
  for (int i = 0; i < r->ndevices; i++) {
    const vmmshim_residue_device_t *d = &r->devices[i];
    if (d->growth < (int64_t)VS_RESIDUE_GROWTH_MIN) continue;
    char sites[480] = "";
    size_t n = 0;
    for (int s = 0; s < r->nsites && n < sizeof sites - 1; s++)
      if (r->sites[s].growth > 0)
        n += (size_t)snprintf(sites + n, sizeof sites - n, "%s%s+0x%llx%s%s%s grew %lld bytes", n ? ", " : "",
                              r->sites[s].lib, (unsigned long long)r->sites[s].offset, r->sites[s].symbol[0] ? " (" : "",
                              r->sites[s].symbol, r->sites[s].symbol[0] ? ")" : "", (long long)r->sites[s].growth);
    _vs_warn("residue: device %d holds %lld bytes more after sleep %llu than after the first (%llu in use, %lld "
             "unexplained)%s%s", d->device, (long long)d->growth, (unsigned long long)r->seq,
             (unsigned long long)d->used, (long long)d->unexplained, sites[0] ? "; sites that grew: " : "", sites);
  }
}

void _vs_residue_after_sleep(void) {
  vmmshim_residue_t *r = malloc(sizeof *r);
  vs_outside_figures_t *of = malloc(sizeof *of);
  if (!r || !of) {
    free(r);
    free(of);
    return;
  }
  take(r, of, true);
  for (int i = 0; i < r->ndevices; i++)
    _vs_info("residue after sleep %llu: device %d: %llu bytes in use of %llu: tags %llu, libraries %llu, managed %llu, "
             "graphs %llu, context %llu, modules %llu, inferred %llu, other processes %llu, unexplained %lld",
             (unsigned long long)r->seq, r->devices[i].device,
             (unsigned long long)r->devices[i].used, (unsigned long long)r->devices[i].total,
             (unsigned long long)r->devices[i].tags, (unsigned long long)r->devices[i].libraries,
             (unsigned long long)r->devices[i].managed, (unsigned long long)r->devices[i].graph,
             (unsigned long long)r->devices[i].context, (unsigned long long)r->devices[i].modules,
             (unsigned long long)r->devices[i].inferred, (unsigned long long)r->devices[i].others, (long long)r->devices[i].unexplained);
  if (vs_unlikely(_vs_trace_on)) trace_residue(r);
  warn_growth(r);
  free(r);
  free(of);
}
