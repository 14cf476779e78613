/* control_group.c: the member's side of a group-wide sleep or wake (`vmmshim ctl --group NAME
 * sleep|wake`, docs/control.md "A whole group").
 *
 * The client orchestrates a sleep over the members' control sockets in two phases. Phase 1 is
 * `quiesce` on every member: new GPU work waits at the gate, no stream capture is in progress,
 * every context is synchronised; the reply lists the tags and which sleep already (what a rollback
 * must leave asleep). The gate then stays closed (a hold, identified by a token) while the client
 * waits for the others; phase 2 sends the existing `sleep` on the same connection (the move closes
 * and opens the gate inside the hold: closes nest), and `release` ends the hold. A group wake
 * sends only `wake`: it cannot be rolled back, so it has nothing to hold the members for.
 *
 * A hold never outlives its client: it ends at `release`, when the connection that took it
 * closes (a client killed with SIGKILL included), or when its lease runs out (a client stopped, or
 * one that forgot), whichever comes first. One hold at a time per process: a second quiesce gets
 * EBUSY. The end is a compare-and-swap of the token, so exactly one of the three opens the gate.
 * The lease is watched by a thread of the shim started with the hold, which polls the token every
 * VS_QUIESCE_POLL_MS and exits as soon as the hold ends. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "vmmshim/alloc.h"
#include "vmmshim/control.h"
#include "vmmshim/trace.h"

#define VS_QUIESCE_LEASE_MS 30000ull      /* the default lease */
#define VS_QUIESCE_LEASE_MAX_MS 600000ull /* a client may ask for at most this */
#define VS_QUIESCE_POLL_MS 20u

static atomic_uint_fast64_t vs_q_token; /* the hold's token; 0: none */
static atomic_uint_fast64_t vs_q_conn;  /* the connection that took it */
static atomic_uint_fast64_t vs_q_deadline_ns;
static atomic_uint_fast64_t vs_q_since_ns;
static atomic_uint_fast64_t vs_q_next = 1;
static atomic_uint_fast64_t vs_q_expired; /* holds ended by their lease, for status and tests */

/* Ends the hold of token, once: true when this call did (and opened the gate). kind: how
 * (VS_TRACE_GROUP_RELEASE, _LEASE, _CLOSED), for the trace. */
static bool end_hold(uint_fast64_t token, int kind, const char *why) {
  uint_fast64_t want = token;
  if (!token || !atomic_compare_exchange_strong(&vs_q_token, &want, 0)) return false;
  uint64_t held_ns = _vs_now_ns() - atomic_load(&vs_q_since_ns), held_ms = held_ns / 1000000ull;
  _vs_unquiesce();
  if (vs_unlikely(_vs_trace_on)) _vs_trace_group(kind, 0, 0, 0, held_ns);
  if (why) _vs_warn("group quiesce: %s after %llu ms: new GPU work goes on", why, (unsigned long long)held_ms);
  else _vs_info("group quiesce: released after %llu ms", (unsigned long long)held_ms);
  return true;
}

static void *lease_watch(void *arg) {
  uint_fast64_t token = (uint_fast64_t)(uintptr_t)arg;
  while (atomic_load(&vs_q_token) == token) {
    if (_vs_now_ns() >= atomic_load(&vs_q_deadline_ns)) {
      if (end_hold(token, VS_TRACE_GROUP_LEASE, "the lease ran out (no release from the client)"))
        atomic_fetch_add(&vs_q_expired, 1);
      break;
    }
    _vs_sleep_us(VS_QUIESCE_POLL_MS * 1000u);
  }
  return NULL;
}

/* "tags":[{"name":T,"asleep":B}...]: what a rollback must put back is what this command put to
 * sleep, so the client needs to know which tags slept already; in the quiesce reply it costs the
 * client no `status` round trip on the way to the move. */
static void out_tags(vs_jout_t *o) {
  vmmshim_tag_stats_t tags[VMMSHIM_MAX_TAGS];
  int nt = _vs_tag_stats(tags, VMMSHIM_MAX_TAGS);
  if (nt > VMMSHIM_MAX_TAGS) nt = VMMSHIM_MAX_TAGS;
  _vs_ctl_out(o, ",\"tags\":[");
  for (int i = 0; i < nt; i++) {
    _vs_ctl_out(o, "%s{\"name\":", i ? "," : "");
    _vs_ctl_out_str(o, tags[i].name);
    _vs_ctl_kv_bool(o, "asleep", tags[i].asleep);
    _vs_ctl_out(o, "}");
  }
  _vs_ctl_out(o, "]");
}

/* {"cmd":"quiesce","lease_ms":N}: the hold; its token, lease and how long the quiesce took. */
void _vs_ctl_quiesce(const vs_jobject_t *req, vs_jout_t *o) {
  const vs_jmember_t *lm = _vs_ctl_get(req, "lease_ms");
  uint64_t lease_ms = VS_QUIESCE_LEASE_MS;
  if (lm && lm->type != J_NULL) {
    if (lm->type != J_INT || lm->num < 1 || (uint64_t)lm->num > VS_QUIESCE_LEASE_MAX_MS) {
      _vs_ctl_error(o, req, EINVAL, "'lease_ms' must be a number of milliseconds from 1 to %llu",
                    (unsigned long long)VS_QUIESCE_LEASE_MAX_MS);
      return;
    }
    lease_ms = (uint64_t)lm->num;
  }
  if (atomic_load(&vs_q_token)) {
    _vs_ctl_error(o, req, EBUSY, "quiesced already by another client (one hold at a time)");
    return;
  }
  uint64_t t0 = _vs_now_ns();
  char why[160] = "";
  int rc = _vs_quiesce(why, sizeof why);
  if (vs_unlikely(_vs_trace_on)) _vs_trace_group(VS_TRACE_GROUP_QUIESCE, 0, 0, rc, _vs_now_ns() - t0);
  if (rc) {
    _vs_ctl_error(o, req, -rc, "%s", why[0] ? why : strerror(-rc));
    return;
  }
  uint64_t now = _vs_now_ns();
  uint_fast64_t token = atomic_fetch_add(&vs_q_next, 1);
  atomic_store(&vs_q_conn, _vs_ctl_connection());
  atomic_store(&vs_q_since_ns, now);
  atomic_store(&vs_q_deadline_ns, now + lease_ms * 1000000ull);
  atomic_store(&vs_q_token, token); /* only this thread takes holds: no race to take one */
  pthread_t th;
  if (_vs_thread_start(&th, lease_watch, (void *)(uintptr_t)token) != 0) {
    end_hold(token, VS_TRACE_GROUP_RELEASE, NULL); /* a hold nothing would end on its own is not taken */
    _vs_ctl_error(o, req, EAGAIN, "no thread for the lease: not quiesced");
    return;
  }
  _vs_info("group quiesce: held (token %llu, lease %llu ms)", (unsigned long long)token, (unsigned long long)lease_ms);
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_u64(o, "token", token);
  _vs_ctl_kv_u64(o, "lease_ms", lease_ms);
  _vs_ctl_out(o, ",\"ms\":%.3f", (double)(now - t0) / 1e6);
  out_tags(o);
}

/* {"cmd":"release","token":N}: the hold ends; ESRCH when it had ended already (its lease, say). */
void _vs_ctl_release(const vs_jobject_t *req, vs_jout_t *o) {
  const vs_jmember_t *tk = _vs_ctl_get(req, "token");
  if (!tk || tk->type != J_INT || tk->num < 1) {
    _vs_ctl_error(o, req, EINVAL, "'token' (the number quiesce answered) is missing or not a number above 0");
    return;
  }
  uint64_t since = atomic_load(&vs_q_since_ns);
  if (!end_hold((uint_fast64_t)tk->num, VS_TRACE_GROUP_RELEASE, NULL)) {
    _vs_ctl_error(o, req, ESRCH, "no hold %lld: it ended already (its lease ran out, or it was released)", tk->num);
    return;
  }
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_out(o, ",\"held_ms\":%.3f", (double)(_vs_now_ns() - since) / 1e6);
  _vs_ctl_kv_u64(o, "expired", atomic_load(&vs_q_expired));
}

void _vs_ctl_group_closed(uint64_t conn) {
  uint_fast64_t token = atomic_load(&vs_q_token);
  if (token && conn && atomic_load(&vs_q_conn) == conn)
    end_hold(token, VS_TRACE_GROUP_CLOSED, "the client's connection closed without a release");
}

/* ------------------------------------------------------------------ ballooning */

/* {"cmd":"priority","priority":N}: this member's priority in its group (N absent: read it). */
void _vs_ctl_priority(const vs_jobject_t *req, vs_jout_t *o) {
  const vs_jmember_t *p = _vs_ctl_get(req, "priority");
  int set = -1;
  if (p && p->type != J_NULL) {
    if (p->type != J_INT || p->num < 0 || p->num > 1000) {
      _vs_ctl_error(o, req, EINVAL, "'priority' must be a whole number from 0 to 1000");
      return;
    }
    set = (int)p->num;
  }
  int before = _vs_group_priority(set);
  if (before < 0) {
    _vs_ctl_error(o, req, ENODEV, "this process is in no group (VMMSHIM_LIMIT_GROUP): a priority orders a group's "
                                  "members");
    return;
  }
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_int(o, "priority", set >= 0 ? set : before);
  _vs_ctl_kv_int(o, "previous", before);
}

/* {"cmd":"cold","tag":T,"mode":"mapped"|"host"|"discard"|"off"}: T is lent first, in that mode. */
void _vs_ctl_cold(const vs_jobject_t *req, vs_jout_t *o) {
  const char *tag, *mode_name;
  if (!_vs_ctl_arg_str(req, "tag", true, &tag, o) || !_vs_ctl_arg_str(req, "mode", false, &mode_name, o)) return;
  int mode = VMMSHIM_SLEEP_MAPPED;
  if (mode_name && !strcmp(mode_name, "off")) mode = -1;
  else if (mode_name && (mode = _vs_cold_mode_of(mode_name)) < 0) {
    _vs_ctl_error(o, req, EINVAL, "mode '%s': mapped, host, discard or off", mode_name);
    return;
  }
  int previous = -1, rc = _vs_cold_set(tag, mode, &previous);
  if (rc) {
    _vs_ctl_error(o, req, -rc, rc == -ENOSPC ? "no room for one more tag" : "'%s' is not a tag name", tag);
    return;
  }
  static const char *const names[] = {"off", "discard", "host", "mapped"};
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_str(o, "tag", tag);
  _vs_ctl_kv_str(o, "mode", names[mode + 1]);
  _vs_ctl_kv_str(o, "previous", names[previous + 1]);
}

/* {"cmd":"demote","bytes":N,"for":PID}: a member of higher priority (borrow.c) needs N bytes. */
void _vs_ctl_demote(const vs_jobject_t *req, vs_jout_t *o) {
  uint64_t want;
  if (!_vs_ctl_arg_size(req, "bytes", true, &want, o)) return;
  const vs_jmember_t *f = _vs_ctl_get(req, "for");
  pid_t borrower = f && f->type == J_INT && f->num > 0 ? (pid_t)f->num : 0;
  uint64_t released = 0, t0 = _vs_now_ns();
  char why[200] = "";
  int rc = _vs_balloon_demote(want, borrower, &released, why, sizeof why);
  double ms = (double)(_vs_now_ns() - t0) / 1e6;
  if (rc) _vs_ctl_error(o, req, -rc, "%s", why);
  else _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_u64(o, "released", released);
  _vs_ctl_kv_u64(o, "lent", _vs_balloon_lent());
  /* The lender's share of the borrower's wait: its sleeps, host memory obtained on the way included. */
  _vs_ctl_out(o, ",\"ms\":%.3f", ms);
}
