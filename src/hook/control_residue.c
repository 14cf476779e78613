/* control_residue.c: the control channel's `residue` verb (docs/control.md): what is still on
 * each device and who owns it (src/alloc/residue.c computes it). */
#include <stdio.h>
#include <string.h>

#include "vmmshim/alloc.h"
#include "vmmshim/control.h"

static const char *const vs_kind_names[] = {"vmm", "managed", "host", "arrays"};

static void put_device(vs_jout_t *o, const vmmshim_residue_device_t *d, bool first) {
  _vs_ctl_out(o, "%s{\"device\":%d", first ? "" : ",", d->device);
  _vs_ctl_kv_bool(o, "measured", d->measured != 0);
  _vs_ctl_kv_u64(o, "total", d->total);
  _vs_ctl_kv_u64(o, "free", d->free);
  _vs_ctl_kv_u64(o, "used", d->used);
  _vs_ctl_out(o, ",\"owners\":{");
  _vs_ctl_out(o, "\"tags\":%llu", (unsigned long long)d->tags);
  _vs_ctl_kv_u64(o, "libraries", d->libraries);
  _vs_ctl_kv_u64(o, "managed", d->managed);
  _vs_ctl_kv_u64(o, "graphs", d->graph);
  _vs_ctl_kv_u64(o, "arrays", d->arrays);
  _vs_ctl_kv_u64(o, "context", d->context);
  _vs_ctl_kv_u64(o, "modules", d->modules);
  _vs_ctl_kv_u64(o, "inferred", d->inferred);
  _vs_ctl_kv_u64(o, "other_processes", d->others);
  _vs_ctl_kv_int(o, "unexplained", d->unexplained);
  _vs_ctl_out(o, "}");
  _vs_ctl_kv_u64(o, "process", d->process);
  _vs_ctl_kv_int(o, "growth", d->growth);
  _vs_ctl_out(o, "}");
}

/* The residue's figures, into a reply. */
static void residue_fields(vs_jout_t *o, const vmmshim_residue_t *r) {
  _vs_ctl_kv_u64(o, "sleeps", r->seq);
  _vs_ctl_out(o, ",\"devices\":[");
  for (int i = 0; i < r->ndevices; i++) put_device(o, &r->devices[i], i == 0);
  _vs_ctl_out(o, "],\"libraries\":[");
  for (int i = 0; i < r->nlibs; i++) {
    const vmmshim_residue_lib_t *l = &r->libs[i];
    _vs_ctl_out(o, "%s{\"name\":", i ? "," : "");
    _vs_ctl_out_str(o, l->name);
    _vs_ctl_kv_u64(o, "vmm", l->vmm);
    _vs_ctl_kv_u64(o, "managed", l->managed);
    _vs_ctl_kv_u64(o, "host", l->host);
    _vs_ctl_kv_u64(o, "arrays", l->arrays);
    _vs_ctl_out(o, "}");
  }
  _vs_ctl_out(o, "],\"sites\":[");
  for (int i = 0; i < r->nsites; i++) {
    const vmmshim_residue_site_t *s = &r->sites[i];
    _vs_ctl_out(o, "%s{\"library\":", i ? "," : "");
    _vs_ctl_out_str(o, s->lib);
    _vs_ctl_out(o, ",\"address\":\"0x%llx\"", (unsigned long long)s->addr);
    _vs_ctl_out(o, ",\"offset\":\"0x%llx\"", (unsigned long long)s->offset);
    _vs_ctl_kv_str(o, "symbol", s->symbol);
    _vs_ctl_kv_str(o, "kind", vs_kind_names[s->kind >= 0 && s->kind < 4 ? s->kind : 0]);
    _vs_ctl_kv_u64(o, "bytes", s->bytes);
    _vs_ctl_kv_int(o, "growth", s->growth);
    _vs_ctl_kv_u64(o, "stack", s->stack);
    _vs_ctl_kv_str(o, "python", s->python);
    _vs_ctl_out(o, "}");
  }
  _vs_ctl_out(o, "]");
  _vs_ctl_kv_u64(o, "host_pinned", r->host_pinned);
  _vs_ctl_kv_u64(o, "shared", r->shared);
  _vs_ctl_kv_bool(o, "other_processes_known", r->others_known != 0);
  _vs_ctl_kv_str(o, "note", r->note);
}

void _vs_ctl_do_residue(const vs_jobject_t *req, vs_jout_t *o) {
  static vmmshim_residue_t r; /* the server thread's alone */
  int rc = vmmshim_residue(&r, sizeof r);
  if (rc) {
    _vs_ctl_error(o, req, -rc, "no residue: %s", strerror(-rc));
    return;
  }
  vmmshim_tag_stats_t tags[VMMSHIM_MAX_TAGS];
  int nt = vmmshim_tag_stats(tags, VMMSHIM_MAX_TAGS, sizeof tags[0]);
  if (nt > VMMSHIM_MAX_TAGS) nt = VMMSHIM_MAX_TAGS;
  _vs_ctl_reply_begin(o, true, req);
  residue_fields(o, &r);
  _vs_ctl_out(o, ",\"tags\":[");
  for (int i = 0, n = 0; i < nt; i++) {
    if (!tags[i].device) continue; /* the tags that hold device memory */
    _vs_ctl_out(o, "%s{\"name\":", n++ ? "," : "");
    _vs_ctl_out_str(o, tags[i].name);
    _vs_ctl_kv_u64(o, "device", tags[i].device);
    _vs_ctl_kv_bool(o, "asleep", tags[i].asleep != 0);
    _vs_ctl_out(o, "}");
  }
  _vs_ctl_out(o, "]");
}

/* status's figure of memory made outside the pools (no driver call: `vmmshim top` asks often). */
void _vs_ctl_outside_fields(vs_jout_t *o) {
  static vs_outside_figures_t f; /* the server thread's alone */
  _vs_outside_figures(&f);
  uint64_t vmm = 0, managed = 0;
  for (int d = 0; d < VS_OUTSIDE_DEVICES; d++) {
    vmm += f.dev[d][VS_OUTSIDE_VMM];
    managed += f.dev[d][VS_OUTSIDE_MANAGED];
  }
  _vs_ctl_out(o, ",\"outside\":{\"vmm\":%llu,\"managed\":%llu,\"host\":%llu}", (unsigned long long)vmm,
              (unsigned long long)managed, (unsigned long long)f.host);
}
