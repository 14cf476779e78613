/* group_members.c: what the members of a group know of each other for ballooning
 * (VMMSHIM_ON_LIMIT=balloon, docs/limits.md "Priorities and ballooning"): each member's priority,
 * the members a growth may borrow from (strictly lower priority, lowest first), and the bytes
 * lent and borrowed, kept in the member slots of the segment (vmmshim/group.h) so that
 * `vmmshim ctl --group NAME status` shows who lent what to whom. Every read and change is made
 * under the group's lock, through group.c's _vs_group_with. */
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "vmmshim/handles.h"

/* This member's priority (set, when not negative, after it is read) and its bytes lent and
 * borrowed. */
typedef struct vs_prio_arg_s {
  int set, got;
  uint64_t lent, borrowed;
} vs_prio_arg_t;

static void prio_fn(vs_group_header_t *h, vs_group_member_t *me, void *arg) {
  (void)h;
  vs_prio_arg_t *a = arg;
  a->got = me->priority;
  a->lent = me->lent;
  a->borrowed = me->borrowed;
  if (a->set >= 0) me->priority = a->set;
}

int _vs_group_priority(int set) {
  vs_prio_arg_t a = {set, -1, 0, 0};
  return _vs_group_with(prio_fn, &a) ? a.got : -1;
}

typedef struct vs_lenders_arg_s {
  pid_t *pids;
  int32_t prio[VS_GROUP_MEMBERS];
  int n, max;
} vs_lenders_arg_t;

static void lenders_fn(vs_group_header_t *h, vs_group_member_t *me, void *arg) {
  vs_lenders_arg_t *a = arg;
  vs_group_member_t *m = vs_group_members(h);
  for (unsigned i = 0; i < VS_GROUP_MEMBERS && a->n < a->max; i++) {
    if (!m[i].pid || &m[i] == me || m[i].priority >= me->priority) continue;
    int j = a->n++; /* insertion by priority, lowest first */
    while (j > 0 && a->prio[j - 1] > m[i].priority) {
      a->pids[j] = a->pids[j - 1];
      a->prio[j] = a->prio[j - 1];
      j--;
    }
    a->pids[j] = (pid_t)m[i].pid;
    a->prio[j] = m[i].priority;
  }
}

int _vs_group_lenders(pid_t *pids, int max) {
  vs_lenders_arg_t a;
  a.pids = pids;
  a.n = 0;
  a.max = max;
  return _vs_group_with(lenders_fn, &a) ? a.n : 0;
}

typedef struct vs_lend_arg_s {
  uint64_t bytes;
  pid_t borrower;
  bool out;
} vs_lend_arg_t;

static void lend_fn(vs_group_header_t *h, vs_group_member_t *me, void *arg) {
  vs_lend_arg_t *a = arg;
  vs_group_member_t *m = vs_group_members(h), *b = NULL;
  for (unsigned i = 0; i < VS_GROUP_MEMBERS && a->borrower; i++)
    if (m[i].pid == (uint32_t)a->borrower) b = &m[i];
  if (a->out) {
    me->lent += a->bytes;
    me->demotions++;
    if (b) b->borrowed += a->bytes;
  } else {
    me->lent -= a->bytes < me->lent ? a->bytes : me->lent;
    me->promotions++;
    if (b) b->borrowed -= a->bytes < b->borrowed ? a->bytes : b->borrowed;
  }
  me->lending = me->lent != 0;
}

void _vs_group_lend(uint64_t bytes, pid_t borrower, bool out) {
  vs_lend_arg_t a = {bytes, borrower, out};
  (void)_vs_group_with(lend_fn, &a);
}

typedef struct vs_room_arg_s {
  uint64_t bytes;
  unsigned margin_pct;
  bool fits;
} vs_room_arg_t;

/* Room for bytes more, with margin_pct of each limit that applies left over. */
static bool room_under(uint64_t limit, uint64_t total, uint64_t bytes, unsigned margin_pct) {
  if (!limit) return true;
  uint64_t margin = limit / 100 * margin_pct;
  return total <= limit && bytes <= limit - total && margin <= limit - total - bytes;
}

static void room_fn(vs_group_header_t *h, vs_group_member_t *me, void *arg) {
  (void)me;
  vs_room_arg_t *a = arg;
  a->fits = room_under(h->limit_all, h->total_all, a->bytes, a->margin_pct);
  for (unsigned d = 0; d < VS_GROUP_DEVICES && a->fits; d++) /* where the bytes go is not known: each */
    a->fits = room_under(h->limit[d], h->total[d], a->bytes, a->margin_pct);
}

bool _vs_group_room(uint64_t bytes, unsigned margin_pct) {
  vs_room_arg_t a = {bytes, margin_pct, false};
  return _vs_group_with(room_fn, &a) && a.fits;
}

bool _vs_group_balance(int *priority, uint64_t *lent, uint64_t *borrowed) {
  vs_prio_arg_t a = {-1, 0, 0, 0};
  if (!_vs_group_with(prio_fn, &a)) return false;
  *priority = a.got;
  *lent = a.lent;
  *borrowed = a.borrowed;
  return true;
}
