/* control_group.c: the member's side of a group-wide sleep or wake (`vmmshim ctl --group NAME
 * sleep|wake`, docs/control.md "A whole group").
 *
 * The client orchestrates over the members' control sockets in two phases. Phase 1 is `quiesce`
 * on every member: new GPU work waits at the gate, no stream capture is in progress, every context
 * is synchronised. The gate then stays closed (a hold, identified by a token) while the client
 * waits for the others; phase 2 sends the existing `sleep` or `wake` on the same connection (the
 * move closes and opens the gate inside the hold: closes nest), and `release` ends the hold.
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

#define VS_QUIESCE_LEASE_MS 30000ull      /* the default lease */
#define VS_QUIESCE_LEASE_MAX_MS 600000ull /* a client may ask for at most this */
#define VS_QUIESCE_POLL_MS 20u

static atomic_uint_fast64_t vs_q_token; /* the hold's token; 0: none */
static atomic_uint_fast64_t vs_q_conn;  /* the connection that took it */
static atomic_uint_fast64_t vs_q_deadline_ns;
static atomic_uint_fast64_t vs_q_since_ns;
static atomic_uint_fast64_t vs_q_next = 1;
static atomic_uint_fast64_t vs_q_expired; /* holds ended by their lease, for status and tests */

/* Ends the hold of token, once: true when this call did (and opened the gate). */
static bool end_hold(uint_fast64_t token, const char *why) {
  uint_fast64_t want = token;
  if (!token || !atomic_compare_exchange_strong(&vs_q_token, &want, 0)) return false;
  uint64_t held_ms = (_vs_now_ns() - atomic_load(&vs_q_since_ns)) / 1000000ull;
  _vs_unquiesce();
  if (why) _vs_warn("group quiesce: %s after %llu ms: new GPU work goes on", why, (unsigned long long)held_ms);
  else _vs_info("group quiesce: released after %llu ms", (unsigned long long)held_ms);
  return true;
}

static void *lease_watch(void *arg) {
  uint_fast64_t token = (uint_fast64_t)(uintptr_t)arg;
  while (atomic_load(&vs_q_token) == token) {
    if (_vs_now_ns() >= atomic_load(&vs_q_deadline_ns)) {
      if (end_hold(token, "the lease ran out (no release from the client)")) atomic_fetch_add(&vs_q_expired, 1);
      break;
    }
    _vs_sleep_us(VS_QUIESCE_POLL_MS * 1000u);
  }
  return NULL;
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
    end_hold(token, NULL); /* a hold nothing would end on its own is not taken */
    _vs_ctl_error(o, req, EAGAIN, "no thread for the lease: not quiesced");
    return;
  }
  _vs_info("group quiesce: held (token %llu, lease %llu ms)", (unsigned long long)token, (unsigned long long)lease_ms);
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_u64(o, "token", token);
  _vs_ctl_kv_u64(o, "lease_ms", lease_ms);
  _vs_ctl_out(o, ",\"ms\":%.3f", (double)(now - t0) / 1e6);
}

/* {"cmd":"release","token":N}: the hold ends; ESRCH when it had ended already (its lease, say). */
void _vs_ctl_release(const vs_jobject_t *req, vs_jout_t *o) {
  const vs_jmember_t *tk = _vs_ctl_get(req, "token");
  if (!tk || tk->type != J_INT || tk->num < 1) {
    _vs_ctl_error(o, req, EINVAL, "'token' (the number quiesce answered) is missing or not a number above 0");
    return;
  }
  uint64_t since = atomic_load(&vs_q_since_ns);
  if (!end_hold((uint_fast64_t)tk->num, NULL)) {
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
    end_hold(token, "the client's connection closed without a release");
}
