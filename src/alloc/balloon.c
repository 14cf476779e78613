/* balloon.c: the lender's side of ballooning (VMMSHIM_ON_LIMIT=balloon, docs/limits.md
 * "Priorities and ballooning").
 *
 * A member of a group marks tags as cold (VMMSHIM_COLD_TAGS=kv,cache:host, or `vmmshim ctl PID
 * cold TAG`), each with the mode it leaves the device in: mapped by default (the program keeps
 * running on host memory at the same addresses), host or discard where the tag says so. When a
 * member of higher priority cannot grow under the group's limit, it asks this one, over the
 * control channel (`demote`, control_group.c), to move memory out: the cold tags sleep, one after
 * another, until the bytes asked for have left, and the segment records who lent what to whom.
 * Only cold tags are lent: a member that marked none lends nothing.
 *
 * The memory comes back by itself: a watcher thread, running while anything is lent, wakes each
 * lent tag once the group has room for it with VS_BALLOON_MARGIN_PCT of the limit left over, and
 * not sooner than VS_BALLOON_HOLD_MS after the last demotion, so that a load that crosses the
 * limit again and again does not move the same memory out and back each time. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/alloc.h"
#include "vmmshim/trace.h"

#define VS_BALLOON_HOLD_MS 1000ull /* lent memory stays out at least this long after a demotion */
#define VS_BALLOON_MARGIN_PCT 10u  /* and comes back when it fits with this much of the limit spare */
#define VS_BALLOON_POLL_MS 50u
#define VS_BALLOON_LENT_MAX VS_MAX_TAGS

static atomic_int vs_cold[VS_MAX_TAGS]; /* 0: not cold; else its mode + 1 */
static pthread_once_t vs_cold_once = PTHREAD_ONCE_INIT;

typedef struct vs_lent_s {
  int tag;
  pid_t borrower;
  uint64_t bytes;
} vs_lent_t;

static vs_lock_t vs_balloon_lock = VS_LOCK_INITIALIZER(VS_RANK_BALLOON, "balloon");
static vs_lent_t vs_lent[VS_BALLOON_LENT_MAX]; /* under vs_balloon_lock */
static int vs_nlent;
static uint64_t vs_last_demotion_ns;
static bool vs_watching;

static const char *const vs_cold_modes[] = {"discard", "host", "mapped"};

int _vs_cold_mode_of(const char *name) {
  for (int i = 0; i < 3; i++)
    if (!strcmp(name, vs_cold_modes[i])) return i;
  return -1;
}

/* VMMSHIM_COLD_TAGS: TAG[:MODE],... A bad item is said once and left out; the others count. */
static void cold_init(void) {
  const char *text = _vs_option_string(VS_OPT_COLD_TAGS);
  if (!text) return;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", text);
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(item, ':');
    int mode = VMMSHIM_SLEEP_MAPPED;
    if (colon) {
      *colon = 0;
      mode = _vs_cold_mode_of(colon + 1);
    }
    int id = mode < 0 ? -EINVAL : _vs_tag_find(item, true);
    if (id < 0) {
      _vs_warn("VMMSHIM_COLD_TAGS: '%s%s%s' is not TAG[:MODE] (a tag name, MODE mapped, host or discard): left out",
               item, colon ? ":" : "", colon ? colon + 1 : "");
      continue;
    }
    atomic_store(&vs_cold[id], mode + 1);
  }
}

int _vs_cold_set(const char *tag, int mode, int *previous) {
  pthread_once(&vs_cold_once, cold_init);
  if (mode < -1 || mode > VMMSHIM_SLEEP_MAPPED) return -EINVAL;
  int id = _vs_tag_find(tag, true);
  if (id < 0) return id;
  *previous = atomic_exchange(&vs_cold[id], mode + 1) - 1;
  return 0;
}

int _vs_cold_get(int tag) {
  pthread_once(&vs_cold_once, cold_init);
  return tag >= 0 && tag < VS_MAX_TAGS ? atomic_load(&vs_cold[tag]) - 1 : -1;
}

static bool is_lent(int tag) {
  for (int i = 0; i < vs_nlent; i++)
    if (vs_lent[i].tag == tag) return true;
  return false;
}

static void *watch(void *arg);

/* Records a tag lent; starts the watcher when none runs. */
static void note_lent(int tag, pid_t borrower, uint64_t bytes) {
  _vs_lock_take(&vs_balloon_lock);
  if (vs_nlent < VS_BALLOON_LENT_MAX) vs_lent[vs_nlent++] = (vs_lent_t){tag, borrower, bytes};
  vs_last_demotion_ns = _vs_now_ns();
  bool start = !vs_watching;
  vs_watching = true;
  _vs_lock_release(&vs_balloon_lock);
  _vs_group_lend(bytes, borrower, true);
  pthread_t th;
  if (start && _vs_thread_start(&th, watch, NULL) != 0) {
    _vs_lock_take(&vs_balloon_lock);
    vs_watching = false; /* the next demotion tries again; meanwhile nothing comes back by itself */
    _vs_lock_release(&vs_balloon_lock);
    _vs_warn("balloon: no thread to bring lent memory back: it stays off the device until vmmshim ctl wakes it");
  }
}

int _vs_balloon_demote(uint64_t want, pid_t borrower, uint64_t *released, char *why, size_t n) {
  pthread_once(&vs_cold_once, cold_init);
  *released = 0;
  int cold = 0, n_tags = _vs_tag_count();
  for (int t = 0; t < n_tags && *released < want; t++) {
    int mode = _vs_cold_get(t);
    if (mode < 0) continue;
    cold++;
    _vs_lock_take(&vs_balloon_lock);
    bool lent = is_lent(t);
    _vs_lock_release(&vs_balloon_lock);
    if (lent) continue;
    vmmshim_sleep_result_t r;
    int rc = _vs_sleep(_vs_tag_name(t), mode, &r);
    if (vs_unlikely(_vs_trace_on) && (r.released || (rc && rc != -EALREADY))) /* a tag that had nothing: no record */
      _vs_trace_group(VS_TRACE_GROUP_LENT, (int)borrower, r.released, rc, r.ns);
    if (rc == 0 && r.released) {
      *released += r.released;
      note_lent(t, borrower, r.released);
      _vs_info("balloon: tag %s lent %llu bytes (%s) to pid %d", _vs_tag_name(t), (unsigned long long)r.released,
               vs_cold_modes[mode], (int)borrower);
    } else if (rc && rc != -EALREADY) {
      snprintf(why, n, "tag %s: %s", _vs_tag_name(t), r.reason[0] ? r.reason : strerror(-rc));
    }
  }
  if (*released) return 0;
  if (!why[0]) snprintf(why, n, cold ? "every cold tag is off the device already, or holds nothing"
                                     : "no cold tag (VMMSHIM_COLD_TAGS, vmmshim ctl PID cold TAG)");
  return -EALREADY;
}

/* One pass of the watcher: each lent tag that the group has room for comes back. False once
 * nothing is lent (the watcher ends). */
static bool promote_pass(void) {
  vs_lent_t copy[VS_BALLOON_LENT_MAX];
  _vs_lock_take(&vs_balloon_lock);
  int n = vs_nlent;
  memcpy(copy, vs_lent, sizeof copy[0] * (size_t)n);
  uint64_t since = _vs_now_ns() - vs_last_demotion_ns;
  if (!n) vs_watching = false;
  _vs_lock_release(&vs_balloon_lock);
  if (!n) return false;
  if (since < VS_BALLOON_HOLD_MS * 1000000ull) return true;
  for (int i = 0; i < n; i++) {
    if (!_vs_group_room(copy[i].bytes, VS_BALLOON_MARGIN_PCT)) continue;
    vmmshim_sleep_result_t r;
    int rc = _vs_wake(_vs_tag_name(copy[i].tag), 0, &r);
    if (rc && rc != -EALREADY) continue; /* no room after all: later */
    if (vs_unlikely(_vs_trace_on))
      _vs_trace_group(VS_TRACE_GROUP_RETURNED, (int)copy[i].borrower, copy[i].bytes, 0, r.ns);
    _vs_lock_take(&vs_balloon_lock);
    for (int j = 0; j < vs_nlent; j++)
      if (vs_lent[j].tag == copy[i].tag) {
        vs_lent[j] = vs_lent[--vs_nlent];
        break;
      }
    _vs_lock_release(&vs_balloon_lock);
    _vs_group_lend(copy[i].bytes, copy[i].borrower, false);
    _vs_info("balloon: tag %s back on the device (%llu bytes)", _vs_tag_name(copy[i].tag),
             (unsigned long long)copy[i].bytes);
  }
  return true;
}

static void *watch(void *arg) {
  (void)arg;
  do _vs_sleep_us(VS_BALLOON_POLL_MS * 1000u);
  while (promote_pass());
  return NULL;
}

uint64_t _vs_balloon_lent(void) {
  uint64_t sum = 0;
  _vs_lock_take(&vs_balloon_lock);
  for (int i = 0; i < vs_nlent; i++) sum += vs_lent[i].bytes;
  _vs_lock_release(&vs_balloon_lock);
  return sum;
}
