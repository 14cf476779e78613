/* control_rules.c: the `rules` verb (docs/control.md) and the rules in `status`.
 *
 *   {"cmd":"rules"}                   the rules in force, with the allocations each has tagged
 *   {"cmd":"rules","spec":"TAG=..."}  replaces them (docs/tag-rules.md); a malformed spec is an
 *                                     error naming the rule and the character, and changes nothing
 *   {"cmd":"rules","clear":true}      no rules from now on */
#include <errno.h>
#include <string.h>

#include "vmmshim/control.h"

void _vs_ctl_out_rules(vs_jout_t *o) {
  const vs_ruleset_t *rs = _vs_rules_current();
  _vs_ctl_out(o, ",\"rules\":[");
  for (int i = 0; rs && i < rs->n; i++) {
    const vs_rule_t *r = &rs->rules[i];
    _vs_ctl_out(o, "%s{\"rule\":", i ? "," : "");
    _vs_ctl_out_str(o, r->text);
    _vs_ctl_kv_str(o, "tag", r->tag_name);
    _vs_ctl_kv_u64(o, "matched", atomic_load_explicit(&r->matched, memory_order_relaxed));
    _vs_ctl_out(o, "}");
  }
  _vs_ctl_out(o, "]");
}

void _vs_ctl_rules(const vs_jobject_t *req, vs_jout_t *o) {
  const char *spec;
  bool clear;
  if (!_vs_ctl_arg_str(req, "spec", false, &spec, o) || !_vs_ctl_arg_bool(req, "clear", &clear, o)) return;
  if (spec && clear) {
    _vs_ctl_error(o, req, EINVAL, "give 'spec' or 'clear', not both");
    return;
  }
  if (spec || clear) {
    char err[256];
    int rc = _vs_set_tag_rules(clear ? NULL : spec, err, sizeof err);
    if (rc) {
      _vs_ctl_error(o, req, -rc, "%s", err[0] ? err : strerror(-rc));
      return;
    }
  }
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_bool(o, "changed", spec || clear);
  _vs_ctl_out_rules(o);
}
