/* control.c: the control channel. `vmmshim ctl`, `vmmshim top` and vmmshim.control(pid) see and
 * steer a program through it while it runs (docs/control.md says what goes over it).
 *
 * Where: a Unix stream socket in the abstract namespace, "\0vmmshim-ctl-<uid>-<pid>": the kernel
 * removes the name with the process (even one killed with SIGKILL), no directory has to exist or
 * be writable, and /proc/net/unix lists the names, where `vmmshim ctl list` finds them (the uid
 * lets a client pass over other users' processes without connecting). Anyone may connect, so the
 * peer's credentials (SO_PEERCRED) count, checked on every connection: this process's effective
 * uid, or root; anyone else gets one error line and is closed. A process that took the name first
 * cannot pass for this one (clients check the server's pid); this process then goes without a
 * channel, and says so.
 *
 * When: started once, by the thread that activates the shim (the first CUDA call that needs the
 * driver), so a process that never uses CUDA has neither thread nor socket; VMMSHIM_CONTROL=0
 * keeps both away for good. A forked child does not inherit it (CUDA does not work across fork):
 * it closes its copies of the descriptors.
 *
 * How: the shim's socket server (src/base/server.c) serves it on a thread of its own: at most
 * VS_CTL_MAX_CONNS connections (one more takes the slot of the oldest idle one, or is refused with
 * EBUSY when all are busy), requests of one line of JSON of at most VS_CTL_LINE_MAX bytes, each
 * whole within VS_CTL_PARTIAL_MS of its first byte, replies of one line taken within
 * VS_CTL_SEND_MS; a connection idle for VS_CTL_IDLE_MS is closed. This file answers the lines.
 * The program's allocations and frees never wait for that thread: it calls what a thread of the
 * program could (vmmshim_sleep, vmmshim_get_stats, ...). Requests are answered one at a time, in
 * order, so a sleep or wake in progress delays the others. A request is parsed whole and checked
 * before anything is done: a malformed one gets an error reply and changes nothing. Replies are
 * UTF-8 JSON. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vmmshim/alloc.h"
#include "vmmshim/control.h"
#include "vmmshim/server.h"

#define VS_CTL_MAX_CONNS 8
#define VS_CTL_BACKLOG 64
#define VS_CTL_LINE_MAX 4096          /* bytes of a request line, its newline included */
#define VS_CTL_REPLY_MAX (64 << 10)   /* bytes of a reply line */
#define VS_CTL_REPORT_MAX (48 << 10)  /* of which the memory report (dump) */
#define VS_CTL_PARTIAL_MS 5000        /* a request begun must end within this */
#define VS_CTL_IDLE_MS 60000          /* a connection that sends nothing for this long is closed */
#define VS_CTL_SEND_MS 5000           /* a reply must be taken within this */
#define VS_CTL_DEVICES 64

static const char *const vs_mode_names[] = {"discard", "host", "mapped", "disk"};

static void add_result(vs_jout_t *o, const vmmshim_sleep_result_t *r) {
  _vs_ctl_kv_u64(o, "released", r->released);
  _vs_ctl_kv_u64(o, "restored", r->restored);
  _vs_ctl_kv_u64(o, "to_host", r->to_host);
  _vs_ctl_kv_u64(o, "host_mapped", r->host_mapped);
  _vs_ctl_kv_u64(o, "discarded", r->discarded);
  _vs_ctl_kv_u64(o, "skipped", r->skipped);
  _vs_ctl_out(o, ",\"ms\":%.3f", (double)r->ns / 1e6);
  _vs_ctl_kv_str(o, "reason", r->reason);
}

/* A sleep or wake's reply: done, or refused with the result of what moved. */
static void reply_moved(vs_jout_t *o, const vs_jobject_t *req, int rc, const vmmshim_sleep_result_t *r,
                        const char *verb, const char *tag, const char *mode, int level) {
  if (rc) {
    _vs_ctl_error(o, req, -rc, "%s", r->reason[0] ? r->reason : strerror(-rc));
  } else {
    o->n = 0;
    _vs_ctl_reply_begin(o, true, req);
  }
  _vs_ctl_kv_str(o, "cmd", verb);
  _vs_ctl_kv_str(o, "tag", tag ? tag : "all");
  if (mode) _vs_ctl_kv_str(o, "mode", mode);
  if (level >= 0) _vs_ctl_kv_int(o, "level", level);
  add_result(o, r);
}

static void do_sleep(const vs_jobject_t *req, vs_jout_t *o) {
  const char *tag, *mode_name;
  bool all;
  if (!_vs_ctl_arg_target(req, &tag, &all, o) || !_vs_ctl_arg_str(req, "mode", false, &mode_name, o)) return;
  int mode = -1;
  for (int i = 0; mode_name && i < 4; i++)
    if (!strcmp(mode_name, vs_mode_names[i])) mode = i;
  if (mode_name && mode < 0) {
    _vs_ctl_error(o, req, EINVAL, "mode '%s': discard, host, mapped or disk", mode_name);
    return;
  }
  const vs_jmember_t *lv = _vs_ctl_get(req, "level");
  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  if (lv && lv->type != J_NULL) {
    if (lv->type != J_INT || lv->num < 0 || lv->num > 2) {
      _vs_ctl_error(o, req, EINVAL, "'level' must be 0, 1 or 2");
      return;
    }
    if (tag) {
      _vs_ctl_error(o, req, EINVAL, "a level applies to every tag: give 'all': true, not a tag");
      return;
    }
    if (mode == VMMSHIM_SLEEP_DISCARD || mode == VMMSHIM_SLEEP_DISK || (lv->num != 1 && mode >= 0)) {
      _vs_ctl_error(o, req, EINVAL, "level %lld chooses its own modes; only level 1 takes a mode (host or mapped)",
                  lv->num);
      return;
    }
    int rc = vmmshim_sleep_level((int)lv->num, mode == VMMSHIM_SLEEP_MAPPED, &r, sizeof r);
    reply_moved(o, req, rc, &r, "sleep", NULL, mode_name, (int)lv->num);
    return;
  }
  if (mode < 0) mode = VMMSHIM_SLEEP_HOST; /* the mode that loses nothing */
  int rc = vmmshim_sleep(tag, (vmmshim_sleep_mode_t)mode, &r, sizeof r);
  reply_moved(o, req, rc, &r, "sleep", tag, vs_mode_names[mode], -1);
}

static void do_wake(const vs_jobject_t *req, vs_jout_t *o) {
  const char *tag;
  bool all, zero;
  if (!_vs_ctl_arg_target(req, &tag, &all, o) || !_vs_ctl_arg_bool(req, "zero", &zero, o)) return;
  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  int rc = vmmshim_wake(tag, zero ? VMMSHIM_WAKE_ZERO : 0, &r, sizeof r);
  reply_moved(o, req, rc, &r, "wake", tag, NULL, -1);
}

static void do_tag(const vs_jobject_t *req, vs_jout_t *o) {
  const char *tag;
  if (!_vs_ctl_arg_str(req, "tag", true, &tag, o)) return;
  char before[VMMSHIM_TAG_MAX];
  snprintf(before, sizeof before, "%s", _vs_tag_name(atomic_load(&_vs_process_tag)));
  int rc = _vs_set_process_tag(tag);
  if (rc == -EINVAL) {
    _vs_ctl_error(o, req, EINVAL, "'%s' is not a tag name (1-31 of A-Z a-z 0-9 _ . -)", tag);
    return;
  }
  if (rc == -ENOSPC) {
    _vs_ctl_error(o, req, ENOSPC, "no room for tag '%s': a process has at most %d tags", tag, VMMSHIM_MAX_TAGS);
    return;
  }
  if (rc) {
    _vs_ctl_error(o, req, -rc, "%s", strerror(-rc));
    return;
  }
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_str(o, "tag", tag);
  _vs_ctl_kv_str(o, "previous", before);
}

static void do_limit(const vs_jobject_t *req, vs_jout_t *o) {
  uint64_t bytes;
  if (!_vs_ctl_arg_size(req, "bytes", true, &bytes, o)) return;
  uint64_t before = _vs_set_limit(bytes);
  size_t mapped = _vs_mapped_total();
  _vs_info("the limit on mapped bytes is now %llu (was %llu; 0: none), set from outside",
           (unsigned long long)bytes, (unsigned long long)before);
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_u64(o, "limit", bytes);
  _vs_ctl_kv_u64(o, "previous", before);
  _vs_ctl_kv_u64(o, "mapped", mapped);
  if (bytes && mapped > bytes)
    _vs_ctl_kv_str(o, "note", "more than the new limit is mapped: nothing was unmapped; the program cannot grow until it "
                      "maps less (trim gives back idle memory)");
}

/* Memory that ran on host memory past a limit (VMMSHIM_ON_LIMIT=host) back to the device, as far
 * as the limit allows now (after `limit` raised it, say). */
static void do_promote(const vs_jobject_t *req, vs_jout_t *o) {
  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  int rc = vmmshim_promote(&r, sizeof r);
  reply_moved(o, req, rc, &r, "promote", NULL, NULL, -1);
}

static void do_trim(const vs_jobject_t *req, vs_jout_t *o) {
  size_t got = vmmshim_trim();
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_u64(o, "released", got);
  _vs_ctl_kv_u64(o, "mapped", _vs_mapped_total());
}

static void do_release_host(const vs_jobject_t *req, vs_jout_t *o) {
  uint64_t keep;
  if (!_vs_ctl_arg_size(req, "keep", false, &keep, o)) return;
  size_t got = vmmshim_release_host((size_t)keep);
  uint64_t in_use = 0, cached = 0;
  vmmshim_host_memory(&in_use, &cached);
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_u64(o, "released", got);
  _vs_ctl_kv_u64(o, "in_use", in_use);
  _vs_ctl_kv_u64(o, "cached", cached);
}

typedef struct vs_report_copy_s {
  char text[VS_CTL_REPORT_MAX];
  size_t n;
  bool truncated;
} vs_report_copy_t;

static void copy_line(void *arg, const char *line, size_t n) {
  vs_report_copy_t *c = arg;
  if (c->n + n >= sizeof c->text) {
    c->truncated = true;
    return;
  }
  memcpy(c->text + c->n, line, n);
  c->n += n;
  c->text[c->n] = 0;
}

static void do_dump(const vs_jobject_t *req, vs_jout_t *o) {
  static vs_report_copy_t copy; /* the server thread's alone */
  copy.n = 0;
  copy.text[0] = 0;
  copy.truncated = false;
  _vs_log_copy(copy_line, &copy);
  int rc = vmmshim_dump();
  _vs_log_copy(NULL, NULL);
  if (rc) {
    _vs_ctl_error(o, req, ENODEV, "the shim is not active in this process");
    return;
  }
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_str(o, "report", copy.text);
  _vs_ctl_kv_bool(o, "truncated", copy.truncated);
}

/* Per device: what its pools hold. */
typedef struct vs_dev_sum_s {
  int dev, pools;
  vs_pool_figures_t f;
  uint64_t device, host_copied, host_mapped, discarded;
} vs_dev_sum_t;

typedef struct vs_dev_sums_s {
  vs_dev_sum_t d[VS_CTL_DEVICES];
  int n;
} vs_dev_sums_t;

static void add_pool(vs_pool_t *pool, void *arg) {
  vs_dev_sums_t *s = arg;
  int dev = _vs_pool_device(pool), i = 0;
  while (i < s->n && s->d[i].dev != dev) i++;
  if (i == s->n) {
    if (s->n == VS_CTL_DEVICES) return;
    memset(&s->d[i], 0, sizeof s->d[i]);
    s->d[i].dev = dev;
    s->n++;
  }
  vs_dev_sum_t *d = &s->d[i];
  vs_pool_figures_t f;
  _vs_pool_figures(pool, &f);
  _vs_pool_figures_add(&d->f, &f);
  vs_sleep_figures_t sf;
  _vs_pool_sleep_figures(pool, &sf);
  d->device += sf.device;
  d->host_copied += sf.host_copied;
  d->host_mapped += sf.host_mapped;
  d->discarded += sf.discarded;
  d->pools++;
}

static char vs_program[64], vs_cmdline[256];

static void do_status(const vs_jobject_t *req, vs_jout_t *o) {
  static vs_dev_sums_t sums; /* the server thread's alone */
  sums.n = 0;
  _vs_visit_tag(-1, add_pool, &sums);
  vmmshim_tag_stats_t tags[VMMSHIM_MAX_TAGS];
  int nt = _vs_tag_stats(tags, VMMSHIM_MAX_TAGS);
  if (nt > VMMSHIM_MAX_TAGS) nt = VMMSHIM_MAX_TAGS;
  vmmshim_stats_t st;
  vmmshim_get_stats(&st, sizeof st);
  uint64_t in_use = 0, cached = 0;
  vmmshim_host_memory(&in_use, &cached);
  _vs_ctl_reply_begin(o, true, req);
  _vs_ctl_kv_int(o, "pid", (long long)getpid());
  _vs_ctl_kv_int(o, "uid", (long long)geteuid());
  _vs_ctl_kv_str(o, "program", vs_program);
  _vs_ctl_kv_str(o, "cmdline", vs_cmdline);
  _vs_ctl_kv_str(o, "version", VMMSHIM_VERSION);
  _vs_ctl_kv_int(o, "api", VMMSHIM_API_VERSION);
  _vs_ctl_kv_u64(o, "time_ns", _vs_now_ns());
  _vs_ctl_kv_str(o, "process_tag", _vs_tag_name(atomic_load(&_vs_process_tag)));
  _vs_ctl_kv_u64(o, "limit", _vs_limit());
  _vs_ctl_kv_u64(o, "limit_at_start", _vs_option(VS_OPT_LIMIT));
  _vs_ctl_kv_u64(o, "mapped", _vs_mapped_total());
  _vs_ctl_out(o, ",\"host\":{\"in_use\":%llu,\"cached\":%llu,\"limit\":%llu}", (unsigned long long)in_use,
          (unsigned long long)cached, (unsigned long long)_vs_option(VS_OPT_HOST_LIMIT));
  _vs_ctl_out(o, ",\"stats\":{\"allocs\":[%llu,%llu,%llu,%llu],\"frees\":[%llu,%llu,%llu,%llu]",
          (unsigned long long)st.allocs[0], (unsigned long long)st.allocs[1], (unsigned long long)st.allocs[2],
          (unsigned long long)st.allocs[3], (unsigned long long)st.frees[0], (unsigned long long)st.frees[1],
          (unsigned long long)st.frees[2], (unsigned long long)st.frees[3]);
#define VS_STAT_FIELD(f) _vs_ctl_kv_u64(o, #f, st.f);
  VS_STAT_FIELD(alloc_failures) VS_STAT_FIELD(passthrough_allocs) VS_STAT_FIELD(bytes_in_use)
  VS_STAT_FIELD(peak_bytes_in_use) VS_STAT_FIELD(bytes_requested_in_use) VS_STAT_FIELD(bytes_mapped)
  VS_STAT_FIELD(peak_bytes_mapped) VS_STAT_FIELD(vmm_calls) VS_STAT_FIELD(vmm_ns) VS_STAT_FIELD(syncs)
  VS_STAT_FIELD(trims) VS_STAT_FIELD(pools)
#undef VS_STAT_FIELD
  _vs_ctl_kv_u64(o, "stitches", __atomic_load_n(&_vs_stitch_stats.stitches, __ATOMIC_RELAXED));
  _vs_ctl_kv_u64(o, "stitch_handles", __atomic_load_n(&_vs_stitch_stats.handles, __ATOMIC_RELAXED));
  _vs_ctl_kv_u64(o, "stitch_bytes", __atomic_load_n(&_vs_stitch_stats.bytes, __ATOMIC_RELAXED));
  _vs_ctl_out(o, "},\"devices\":[");
  for (int i = 0; i < sums.n; i++) {
    const vs_dev_sum_t *d = &sums.d[i];
    _vs_ctl_out(o, "%s{\"device\":%d", i ? "," : "", d->dev);
    _vs_ctl_kv_u64(o, "live", vs_heaps_sum(d->f.live));
    _vs_ctl_kv_u64(o, "mapped", vs_heaps_sum(d->f.mapped));
    _vs_ctl_kv_u64(o, "idle", vs_heaps_sum(d->f.idle));
    _vs_ctl_kv_u64(o, "pending", vs_heaps_sum(d->f.pending));
    _vs_ctl_kv_u64(o, "handles", d->f.handles);
    _vs_ctl_kv_u64(o, "blocks", d->f.live_blocks);
    _vs_ctl_kv_int(o, "pools", d->pools);
    _vs_ctl_kv_u64(o, "on_device", d->device);
    _vs_ctl_kv_u64(o, "host_copied", d->host_copied);
    _vs_ctl_kv_u64(o, "host_mapped", d->host_mapped);
    _vs_ctl_kv_u64(o, "discarded", d->discarded);
    _vs_ctl_out(o, "}");
  }
  _vs_ctl_out(o, "],\"tags\":[");
  for (int i = 0; i < nt; i++) {
    const vmmshim_tag_stats_t *t = &tags[i];
    _vs_ctl_out(o, "%s{\"name\":", i ? "," : "");
    _vs_ctl_out_str(o, t->name);
    _vs_ctl_kv_u64(o, "live", t->live);
    _vs_ctl_kv_u64(o, "device", t->device);
    _vs_ctl_kv_u64(o, "host_copied", t->host_copied);
    _vs_ctl_kv_u64(o, "host_mapped", t->host_mapped);
    _vs_ctl_kv_u64(o, "discarded", t->discarded);
    _vs_ctl_kv_u64(o, "disk", t->disk);
    _vs_ctl_kv_bool(o, "asleep", t->asleep);
    _vs_ctl_kv_bool(o, "keep", t->keep);
    _vs_ctl_out(o, "}");
  }
  _vs_ctl_out(o, "]");
  _vs_ctl_out_rules(o);
  int prio;
  uint64_t lent, borrowed;
  if (_vs_group_balance(&prio, &lent, &borrowed)) /* ballooning (limits.md): who lent what */
    _vs_ctl_out(o, ",\"group\":{\"priority\":%d,\"lent\":%llu,\"borrowed\":%llu}", prio, (unsigned long long)lent,
                (unsigned long long)borrowed);
}

typedef struct vs_verb_s {
  const char *name;
  void (*fn)(const vs_jobject_t *req, vs_jout_t *o);
} vs_verb_t;

static const vs_verb_t vs_verbs[] = {
    {"status", do_status}, {"tag", do_tag},   {"sleep", do_sleep}, {"wake", do_wake},
    {"trim", do_trim},     {"limit", do_limit}, {"dump", do_dump}, {"release-host", do_release_host},
    {"promote", do_promote},
    {"rules", _vs_ctl_rules},
    {"quiesce", _vs_ctl_quiesce}, {"release", _vs_ctl_release},
    {"priority", _vs_ctl_priority}, {"cold", _vs_ctl_cold}, {"demote", _vs_ctl_demote},
};

static atomic_bool vs_ctl_exiting; /* set at exit: what arrives then is refused */

/* One request line (newline removed) into a reply in o (its newline added). */
static void answer(const char *line, size_t len, vs_jout_t *o) {
  static vs_jobject_t req; /* the server thread's alone */
  vs_jparse_t ps;
  o->n = 0;
  o->full = false;
  if (!_vs_ctl_parse(line, len, &req, &ps)) {
    _vs_ctl_error(o, NULL, EPROTO, "not a request: %s", ps.err);
  } else {
    const vs_jmember_t *v = _vs_ctl_get(&req, "v"), *cmd = _vs_ctl_get(&req, "cmd");
    if (!v || v->type != J_INT) {
      _vs_ctl_error(o, &req, EPROTO, "'v' (the protocol version, %d) is missing or not a number", VS_CTL_VERSION);
    } else if (v->num != VS_CTL_VERSION) {
      _vs_ctl_error(o, &req, EPROTO, "protocol version %lld is not spoken here (this shim speaks %d)", v->num,
                  VS_CTL_VERSION);
    } else if (!cmd || cmd->type != J_STR) {
      _vs_ctl_error(o, &req, EINVAL, "'cmd' (the verb, a string) is missing");
    } else if (atomic_load(&vs_ctl_exiting)) {
      _vs_ctl_error(o, &req, ESRCH, "the program is exiting");
    } else {
      const vs_verb_t *verb = NULL;
      for (size_t i = 0; i < sizeof vs_verbs / sizeof vs_verbs[0]; i++)
        if (!strcmp(cmd->str, vs_verbs[i].name)) verb = &vs_verbs[i];
      if (verb) verb->fn(&req, o);
      else _vs_ctl_error(o, &req, EINVAL, "unknown verb '%.40s': status, tag, sleep, wake, trim, limit, dump, "
                       "release-host, promote, rules, quiesce, release, priority, cold, demote", cmd->str);
    }
  }
  _vs_ctl_out(o, "}\n");
  if (o->full) { /* only the dump can be that long, and it is cut first: say so rather than send half */
    _vs_ctl_error(o, &req, E2BIG, "the reply is longer than %d bytes", VS_CTL_REPLY_MAX);
    _vs_ctl_out(o, "}\n");
  }
}

/* ------------------------------------------------------------------ the server */

static vs_server_t vs_ctl_server;
static pid_t vs_ctl_pid;
static vs_lock_t vs_ctl_lock = VS_LOCK_INITIALIZER(VS_RANK_CONTROL, "control"); /* the start */

static uint64_t vs_ctl_conns, vs_ctl_conn; /* the server thread's alone */

uint64_t _vs_ctl_connection(void) { return vs_ctl_conn; }

static void ctl_closed(uint64_t held) { _vs_ctl_group_closed(held); }

static vs_srv_next_t ctl_answer(int fd, uint64_t *held, const char *req, size_t len, char *out, size_t *out_n) {
  (void)fd;
  if (!*held) *held = ++vs_ctl_conns; /* a number for the connection, which it gets back when closed */
  vs_ctl_conn = *held;
  vs_jout_t o = {out, VS_CTL_REPLY_MAX, 0, false};
  answer(req, len, &o);
  *out_n = o.n;
  return VS_SRV_NEXT;
}

/* The error line a refused connection reads before it is closed. */
static size_t ctl_refusal(vs_srv_refusal_t why, char *out, size_t cap) {
  static const struct { int e; const char *msg; } r[VS_SRV_REFUSALS] = {
      [VS_SRV_WRONG_USER] = {EPERM, "this process belongs to another user: only its user and root may control it"},
      [VS_SRV_FULL] = {EBUSY, "all " VS_STR(VS_CTL_MAX_CONNS) " connections are busy with a request: try again"},
      [VS_SRV_TOO_LONG] = {E2BIG, "a request line is at most " VS_STR(VS_CTL_LINE_MAX) " bytes; closing"},
      [VS_SRV_TOO_SLOW] = {ETIMEDOUT, "a request must end within " VS_STR(VS_CTL_PARTIAL_MS) " ms of its first byte"},
      [VS_SRV_CUT] = {EPROTO, "the connection ended inside a request (no newline)"},
      [VS_SRV_NO_FD] = {EAGAIN, "this process has no file descriptor left: try again"}};
  vs_jout_t o = {out, cap, 0, false};
  _vs_ctl_error(&o, NULL, r[why].e, "%s", r[why].msg);
  _vs_ctl_out(&o, "}\n");
  return o.full ? 0 : o.n;
}

static void at_exit(void) { atomic_store(&vs_ctl_exiting, true); }

/* The program's file name, and its command line (arguments joined by spaces, cut at 255 bytes),
 * for people to know which process is which. */
static void read_program_name(void) {
  char exe[512];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  const char *base = strrchr(exe, '/');
  snprintf(vs_program, sizeof vs_program, "%.63s", base ? base + 1 : exe);
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  n = fd >= 0 ? read(fd, vs_cmdline, sizeof vs_cmdline - 1) : -1;
  if (fd >= 0) close(fd);
  if (n < 0) n = 0;
  while (n > 0 && vs_cmdline[n - 1] == 0) n--;
  for (ssize_t i = 0; i < n; i++)
    if (vs_cmdline[i] == 0) vs_cmdline[i] = ' ';
  vs_cmdline[n] = 0;
}

/* The shim is active: the channel opens (once per process). */
static void control_start(void) {
  _vs_lock_take(&vs_ctl_lock);
  if (vs_ctl_pid) {
    _vs_lock_release(&vs_ctl_lock);
    return;
  }
  vs_ctl_pid = getpid();
  if (!_vs_option(VS_OPT_CONTROL)) { /* asked for: no socket, no thread */
    _vs_info("control: off (VMMSHIM_CONTROL=0); vmmshim ctl cannot reach this process");
    _vs_lock_release(&vs_ctl_lock);
    return;
  }
  read_program_name();
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "vmmshim-ctl-%u-%d", (unsigned)geteuid(), (int)getpid());
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  vs_ctl_server.ops = (vs_server_ops_t){
      .name = "control", .asked = "asked to control this process", .slots = VS_CTL_MAX_CONNS,
      .backlog = VS_CTL_BACKLOG, .line_max = VS_CTL_LINE_MAX, .reply_max = VS_CTL_REPLY_MAX, .root_too = true,
      .idle_ms = VS_CTL_IDLE_MS, .request_ms = VS_CTL_PARTIAL_MS, .send_ms = VS_CTL_SEND_MS,
      .answer = ctl_answer, .refusal = ctl_refusal, .closed = ctl_closed};
  if (_vs_server_start(&vs_ctl_server, &a, len) != 0) {
    _vs_warn("control: vmmshim ctl cannot reach this process");
  } else {
    atexit(at_exit);
    _vs_info("control: vmmshim ctl %d reaches this process (@%s)", (int)getpid(), a.sun_path + 1);
  }
  _vs_lock_release(&vs_ctl_lock);
}

/* Only a pointer is stored here: the channel opens when the shim activates. */
__attribute__((constructor)) static void register_control(void) { _vs_set_activate_handler(control_start); }
