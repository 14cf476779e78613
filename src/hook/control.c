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
#include "vmmshim/server.h"

#define VS_CTL_VERSION 1
#define VS_CTL_MAX_CONNS 8
#define VS_CTL_BACKLOG 64
#define VS_CTL_LINE_MAX 4096          /* bytes of a request line, its newline included */
#define VS_CTL_REPLY_MAX (64 << 10)   /* bytes of a reply line */
#define VS_CTL_REPORT_MAX (48 << 10)  /* of which the memory report (dump) */
#define VS_CTL_PARTIAL_MS 5000        /* a request begun must end within this */
#define VS_CTL_IDLE_MS 60000          /* a connection that sends nothing for this long is closed */
#define VS_CTL_SEND_MS 5000           /* a reply must be taken within this */
#define VS_CTL_MAX_MEMBERS 16
#define VS_CTL_STR_MAX 256
#define VS_CTL_DEVICES 64

/* ------------------------------------------------------------------ requests: flat JSON objects */

typedef enum { J_STR, J_INT, J_BOOL, J_NULL } vs_jtype_t;

typedef struct vs_jmember_s {
  char key[32];
  vs_jtype_t type;
  char str[VS_CTL_STR_MAX];
  long long num;
  bool b;
} vs_jmember_t;

typedef struct vs_jobject_s {
  vs_jmember_t m[VS_CTL_MAX_MEMBERS];
  int n;
} vs_jobject_t;

typedef struct vs_jparse_s {
  const char *start, *p, *end;
  char err[128];
} vs_jparse_t;

static bool jfail(vs_jparse_t *ps, const char *what) {
  if (!ps->err[0]) snprintf(ps->err, sizeof ps->err, "%s (at byte %d)", what, (int)(ps->p - ps->start));
  return false;
}

static void jspace(vs_jparse_t *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n')) ps->p++;
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
}

/* A string at ps->p (its opening quote), decoded into out (cap bytes, NUL-terminated). Escapes
 * of characters past ASCII are refused: no name or value of the protocol needs one. */
static bool jstring(vs_jparse_t *ps, char *out, size_t cap) {
  if (ps->p >= ps->end || *ps->p != '"') return jfail(ps, "a string was expected");
  ps->p++;
  size_t n = 0;
  while (ps->p < ps->end) {
    unsigned char c = (unsigned char)*ps->p++;
    if (c == '"') {
      out[n] = 0;
      return true;
    }
    if (c < 0x20) return jfail(ps, "a control character inside a string");
    if (c == '\\') {
      if (ps->p >= ps->end) break;
      char e = *ps->p++;
      switch (e) {
      case '"': case '\\': case '/': c = (unsigned char)e; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case 'n': c = '\n'; break;
      case 'r': c = '\r'; break;
      case 't': c = '\t'; break;
      case 'u': {
        int v = 0;
        for (int i = 0; i < 4; i++) {
          int h = ps->p < ps->end ? hexval(*ps->p++) : -1;
          if (h < 0) return jfail(ps, "a bad \\u escape");
          v = v * 16 + h;
        }
        if (v == 0 || v > 0x7f) return jfail(ps, "\\u escapes are accepted for ASCII characters other than NUL only");
        c = (unsigned char)v;
        break;
      }
      default: return jfail(ps, "an unknown escape in a string");
      }
    }
    if (n + 1 >= cap) return jfail(ps, "a string too long");
    out[n++] = (char)c;
  }
  return jfail(ps, "a string is not closed");
}

static bool jword(vs_jparse_t *ps, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0) return false;
  ps->p += n;
  return true;
}

static bool jvalue(vs_jparse_t *ps, vs_jmember_t *m) {
  if (ps->p >= ps->end) return jfail(ps, "a value was expected");
  char c = *ps->p;
  if (c == '"') {
    m->type = J_STR;
    return jstring(ps, m->str, sizeof m->str);
  }
  if (c == '{' || c == '[') return jfail(ps, "nested objects and arrays are not accepted");
  if (jword(ps, "true")) { m->type = J_BOOL; m->b = true; return true; }
  if (jword(ps, "false")) { m->type = J_BOOL; m->b = false; return true; }
  if (jword(ps, "null")) { m->type = J_NULL; return true; }
  if (c == '-' || (c >= '0' && c <= '9')) {
    bool neg = c == '-';
    if (neg) ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return jfail(ps, "a bad number");
    if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9')
      return jfail(ps, "a number with a leading zero");
    unsigned long long v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
      unsigned d = (unsigned)(*ps->p++ - '0');
      if (v > (9223372036854775807ull - d) / 10) return jfail(ps, "a number too large");
      v = v * 10 + d;
    }
    if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
      return jfail(ps, "only whole numbers are accepted");
    m->type = J_INT;
    m->num = neg ? -(long long)v : (long long)v;
    return true;
  }
  return jfail(ps, "a value was expected");
}

/* The request line (not NUL-terminated, no newline) into o: one object of at most
 * VS_CTL_MAX_MEMBERS members whose values are strings, whole numbers, true, false or null. */
static bool parse_request(const char *line, size_t len, vs_jobject_t *o, vs_jparse_t *ps) {
  ps->start = ps->p = line;
  ps->end = line + len;
  ps->err[0] = 0;
  o->n = 0;
  if (memchr(line, 0, len)) return jfail(ps, "a NUL byte in the request");
  jspace(ps);
  if (ps->p >= ps->end || *ps->p != '{') return jfail(ps, "a request is one JSON object: '{' was expected");
  ps->p++;
  jspace(ps);
  if (ps->p < ps->end && *ps->p == '}') {
    ps->p++;
  } else {
    for (;;) {
      if (o->n == VS_CTL_MAX_MEMBERS) return jfail(ps, "too many members");
      vs_jmember_t *m = &o->m[o->n];
      jspace(ps);
      if (!jstring(ps, m->key, sizeof m->key)) return false;
      for (int i = 0; i < o->n; i++)
        if (!strcmp(o->m[i].key, m->key)) return jfail(ps, "a member given twice");
      jspace(ps);
      if (ps->p >= ps->end || *ps->p != ':') return jfail(ps, "':' was expected");
      ps->p++;
      jspace(ps);
      if (!jvalue(ps, m)) return false;
      o->n++;
      jspace(ps);
      if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        continue;
      }
      if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        break;
      }
      return jfail(ps, "',' or '}' was expected");
    }
  }
  jspace(ps);
  if (ps->p != ps->end) return jfail(ps, "something follows the object");
  return true;
}

static const vs_jmember_t *jget(const vs_jobject_t *o, const char *key) {
  for (int i = 0; i < o->n; i++)
    if (!strcmp(o->m[i].key, key)) return &o->m[i];
  return NULL;
}

/* ------------------------------------------------------------------ replies */

typedef struct vs_jout_s {
  char *buf;
  size_t cap, n;
  bool full;
} vs_jout_t;

static void out_fmt(vs_jout_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_fmt(vs_jout_t *o, const char *fmt, ...) {
  if (o->full) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(o->buf + o->n, o->cap - o->n, fmt, ap);
  va_end(ap);
  if (k < 0 || (size_t)k >= o->cap - o->n) {
    o->full = true;
    return;
  }
  o->n += (size_t)k;
}

/* The length of the UTF-8 sequence at s (n bytes there), or 0 when it is not valid UTF-8
 * (overlong, a surrogate, past U+10FFFF, or cut). */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0], len = c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0;
  if (len <= 1 || len > n) return len <= n ? len : 0;
  uint32_t cp = c & (0x7fu >> len);
  for (unsigned i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3fu);
  }
  static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
  return cp < least[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : len;
}

/* s as a JSON string, at most max bytes of it. Replies are UTF-8 whatever the bytes they quote
 * (a request's, a program's name): a sequence that is not becomes U+FFFD. */
static void out_str_n(vs_jout_t *o, const char *s, size_t max) {
  out_fmt(o, "\"");
  size_t n = s ? strnlen(s, max) : 0;
  for (size_t i = 0, k; i < n && !o->full; i += k ? k : 1) {
    unsigned char c = (unsigned char)s[i];
    k = utf8_len((const unsigned char *)s + i, n - i);
    if (k > 1) out_fmt(o, "%.*s", (int)k, s + i);
    else if (!k) out_fmt(o, "\\ufffd");
    else if (c == '"' || c == '\\') out_fmt(o, "\\%c", c);
    else if (c == '\n') out_fmt(o, "\\n");
    else if (c < 0x20 || c == 0x7f) out_fmt(o, "\\u%04x", c);
    else out_fmt(o, "%c", c);
  }
  out_fmt(o, "\"");
}
static void out_str(vs_jout_t *o, const char *s) { out_str_n(o, s, (size_t)-1); }

static void kv_u64(vs_jout_t *o, const char *k, uint64_t v) { out_fmt(o, ",\"%s\":%llu", k, (unsigned long long)v); }
static void kv_int(vs_jout_t *o, const char *k, long long v) { out_fmt(o, ",\"%s\":%lld", k, v); }
static void kv_bool(vs_jout_t *o, const char *k, bool v) { out_fmt(o, ",\"%s\":%s", k, v ? "true" : "false"); }
static void kv_str(vs_jout_t *o, const char *k, const char *v) {
  out_fmt(o, ",\"%s\":", k);
  out_str(o, v);
}

static const char *errno_name(int e) {
  switch (e) {
#define VS_E(x) case x: return #x;
    VS_E(EINVAL) VS_E(ENOENT) VS_E(EBUSY) VS_E(ENOMEM) VS_E(ENOTSUP) VS_E(EALREADY) VS_E(ENODEV) VS_E(EIO)
    VS_E(ENOSPC) VS_E(EPERM) VS_E(EPROTO) VS_E(E2BIG) VS_E(ESRCH) VS_E(ETIMEDOUT) VS_E(EAGAIN)
#undef VS_E
  default: return "EUNKNOWN";
  }
}

/* What every reply starts with: the version, whether the request was done, and its id. */
static void reply_begin(vs_jout_t *o, bool ok, const vs_jobject_t *req) {
  out_fmt(o, "{\"v\":%d,\"ok\":%s", VS_CTL_VERSION, ok ? "true" : "false");
  const vs_jmember_t *id = req ? jget(req, "id") : NULL;
  if (id && id->type == J_INT) kv_int(o, "id", id->num);
  else if (id && id->type == J_STR) kv_str(o, "id", id->str);
}

static void reply_error(vs_jout_t *o, const vs_jobject_t *req, int e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_error(vs_jout_t *o, const vs_jobject_t *req, int e, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  o->n = 0;
  o->full = false;
  reply_begin(o, false, req);
  kv_str(o, "error", errno_name(e));
  kv_int(o, "errno", e);
  kv_str(o, "message", msg);
}

/* ------------------------------------------------------------------ the verbs */

static bool arg_str(const vs_jobject_t *req, const char *key, bool required, const char **out, vs_jout_t *o) {
  const vs_jmember_t *m = jget(req, key);
  *out = NULL;
  if (!m || m->type == J_NULL) {
    if (required) reply_error(o, req, EINVAL, "'%s' is missing", key);
    return !required;
  }
  if (m->type != J_STR) {
    reply_error(o, req, EINVAL, "'%s' must be a string", key);
    return false;
  }
  *out = m->str;
  return true;
}

static bool arg_bool(const vs_jobject_t *req, const char *key, bool *out, vs_jout_t *o) {
  const vs_jmember_t *m = jget(req, key);
  *out = false;
  if (!m || m->type == J_NULL) return true;
  if (m->type != J_BOOL) {
    reply_error(o, req, EINVAL, "'%s' must be true or false", key);
    return false;
  }
  *out = m->b;
  return true;
}

/* A size: a whole number of bytes, or a string as VMMSHIM_LIMIT takes ("8G", "512M"); "none": 0. */
static bool arg_size(const vs_jobject_t *req, const char *key, bool required, uint64_t *out, vs_jout_t *o) {
  const vs_jmember_t *m = jget(req, key);
  *out = 0;
  if (!m || m->type == J_NULL) {
    if (required) reply_error(o, req, EINVAL, "'%s' is missing", key);
    return !required;
  }
  if (m->type == J_INT && m->num >= 0) {
    *out = (uint64_t)m->num;
    return true;
  }
  if (m->type == J_STR && (!strcmp(m->str, "none") || _vs_parse_size(m->str, out) == 0)) return true;
  reply_error(o, req, EINVAL, "'%s' must be a size: bytes, or a string such as \"8G\" or \"none\"", key);
  return false;
}

/* The tag of a sleep or wake: "tag": NAME, or "all": true (NULL). */
static bool arg_target(const vs_jobject_t *req, const char **tag, bool *all, vs_jout_t *o) {
  if (!arg_str(req, "tag", false, tag, o) || !arg_bool(req, "all", all, o)) return false;
  if (*tag && *all) {
    reply_error(o, req, EINVAL, "give 'tag' or 'all', not both");
    return false;
  }
  if (!*tag && !*all) {
    reply_error(o, req, EINVAL, "'tag' (a name) or 'all': true is missing");
    return false;
  }
  if (*tag && !_vs_tag_name_ok(*tag)) {
    reply_error(o, req, EINVAL, "'%s' is not a tag name (1-31 of A-Z a-z 0-9 _ . -)", *tag);
    return false;
  }
  return true;
}

static const char *const vs_mode_names[] = {"discard", "host", "mapped"};

static void add_result(vs_jout_t *o, const vmmshim_sleep_result_t *r) {
  kv_u64(o, "released", r->released);
  kv_u64(o, "restored", r->restored);
  kv_u64(o, "to_host", r->to_host);
  kv_u64(o, "host_mapped", r->host_mapped);
  kv_u64(o, "discarded", r->discarded);
  kv_u64(o, "skipped", r->skipped);
  out_fmt(o, ",\"ms\":%.3f", (double)r->ns / 1e6);
  kv_str(o, "reason", r->reason);
}

/* A sleep or wake's reply: done, or refused with the result of what moved. */
static void reply_moved(vs_jout_t *o, const vs_jobject_t *req, int rc, const vmmshim_sleep_result_t *r,
                        const char *verb, const char *tag, const char *mode, int level) {
  if (rc) {
    reply_error(o, req, -rc, "%s", r->reason[0] ? r->reason : strerror(-rc));
  } else {
    o->n = 0;
    reply_begin(o, true, req);
  }
  kv_str(o, "cmd", verb);
  kv_str(o, "tag", tag ? tag : "all");
  if (mode) kv_str(o, "mode", mode);
  if (level >= 0) kv_int(o, "level", level);
  add_result(o, r);
}

static void do_sleep(const vs_jobject_t *req, vs_jout_t *o) {
  const char *tag, *mode_name;
  bool all;
  if (!arg_target(req, &tag, &all, o) || !arg_str(req, "mode", false, &mode_name, o)) return;
  int mode = -1;
  for (int i = 0; mode_name && i < 3; i++)
    if (!strcmp(mode_name, vs_mode_names[i])) mode = i;
  if (mode_name && mode < 0) {
    reply_error(o, req, EINVAL, "mode '%s': discard, host or mapped", mode_name);
    return;
  }
  const vs_jmember_t *lv = jget(req, "level");
  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  if (lv && lv->type != J_NULL) {
    if (lv->type != J_INT || lv->num < 0 || lv->num > 2) {
      reply_error(o, req, EINVAL, "'level' must be 0, 1 or 2");
      return;
    }
    if (tag) {
      reply_error(o, req, EINVAL, "a level applies to every tag: give 'all': true, not a tag");
      return;
    }
    if (mode == VMMSHIM_SLEEP_DISCARD || (lv->num != 1 && mode >= 0)) {
      reply_error(o, req, EINVAL, "level %lld chooses its own modes; only level 1 takes a mode (host or mapped)",
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
  if (!arg_target(req, &tag, &all, o) || !arg_bool(req, "zero", &zero, o)) return;
  vmmshim_sleep_result_t r;
  memset(&r, 0, sizeof r);
  int rc = vmmshim_wake(tag, zero ? VMMSHIM_WAKE_ZERO : 0, &r, sizeof r);
  reply_moved(o, req, rc, &r, "wake", tag, NULL, -1);
}

static void do_tag(const vs_jobject_t *req, vs_jout_t *o) {
  const char *tag;
  if (!arg_str(req, "tag", true, &tag, o)) return;
  char before[VMMSHIM_TAG_MAX];
  snprintf(before, sizeof before, "%s", _vs_tag_name(atomic_load(&_vs_process_tag)));
  int rc = _vs_set_process_tag(tag);
  if (rc == -EINVAL) {
    reply_error(o, req, EINVAL, "'%s' is not a tag name (1-31 of A-Z a-z 0-9 _ . -)", tag);
    return;
  }
  if (rc == -ENOSPC) {
    reply_error(o, req, ENOSPC, "no room for tag '%s': a process has at most %d tags", tag, VMMSHIM_MAX_TAGS);
    return;
  }
  if (rc) {
    reply_error(o, req, -rc, "%s", strerror(-rc));
    return;
  }
  reply_begin(o, true, req);
  kv_str(o, "tag", tag);
  kv_str(o, "previous", before);
}

static void do_limit(const vs_jobject_t *req, vs_jout_t *o) {
  uint64_t bytes;
  if (!arg_size(req, "bytes", true, &bytes, o)) return;
  uint64_t before = _vs_set_limit(bytes);
  size_t mapped = _vs_mapped_total();
  _vs_info("the limit on mapped bytes is now %llu (was %llu; 0: none), set from outside",
           (unsigned long long)bytes, (unsigned long long)before);
  reply_begin(o, true, req);
  kv_u64(o, "limit", bytes);
  kv_u64(o, "previous", before);
  kv_u64(o, "mapped", mapped);
  if (bytes && mapped > bytes)
    kv_str(o, "note", "more than the new limit is mapped: nothing was unmapped; the program cannot grow until it "
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
  reply_begin(o, true, req);
  kv_u64(o, "released", got);
  kv_u64(o, "mapped", _vs_mapped_total());
}

static void do_release_host(const vs_jobject_t *req, vs_jout_t *o) {
  uint64_t keep;
  if (!arg_size(req, "keep", false, &keep, o)) return;
  size_t got = vmmshim_release_host((size_t)keep);
  uint64_t in_use = 0, cached = 0;
  vmmshim_host_memory(&in_use, &cached);
  reply_begin(o, true, req);
  kv_u64(o, "released", got);
  kv_u64(o, "in_use", in_use);
  kv_u64(o, "cached", cached);
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
    reply_error(o, req, ENODEV, "the shim is not active in this process");
    return;
  }
  reply_begin(o, true, req);
  kv_str(o, "report", copy.text);
  kv_bool(o, "truncated", copy.truncated);
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
  reply_begin(o, true, req);
  kv_int(o, "pid", (long long)getpid());
  kv_int(o, "uid", (long long)geteuid());
  kv_str(o, "program", vs_program);
  kv_str(o, "cmdline", vs_cmdline);
  kv_str(o, "version", VMMSHIM_VERSION);
  kv_int(o, "api", VMMSHIM_API_VERSION);
  kv_u64(o, "time_ns", _vs_now_ns());
  kv_str(o, "process_tag", _vs_tag_name(atomic_load(&_vs_process_tag)));
  kv_u64(o, "limit", _vs_limit());
  kv_u64(o, "limit_at_start", _vs_option(VS_OPT_LIMIT));
  kv_u64(o, "mapped", _vs_mapped_total());
  out_fmt(o, ",\"host\":{\"in_use\":%llu,\"cached\":%llu,\"limit\":%llu}", (unsigned long long)in_use,
          (unsigned long long)cached, (unsigned long long)_vs_option(VS_OPT_HOST_LIMIT));
  out_fmt(o, ",\"stats\":{\"allocs\":[%llu,%llu,%llu,%llu],\"frees\":[%llu,%llu,%llu,%llu]",
          (unsigned long long)st.allocs[0], (unsigned long long)st.allocs[1], (unsigned long long)st.allocs[2],
          (unsigned long long)st.allocs[3], (unsigned long long)st.frees[0], (unsigned long long)st.frees[1],
          (unsigned long long)st.frees[2], (unsigned long long)st.frees[3]);
#define VS_STAT_FIELD(f) kv_u64(o, #f, st.f);
  VS_STAT_FIELD(alloc_failures) VS_STAT_FIELD(passthrough_allocs) VS_STAT_FIELD(bytes_in_use)
  VS_STAT_FIELD(peak_bytes_in_use) VS_STAT_FIELD(bytes_requested_in_use) VS_STAT_FIELD(bytes_mapped)
  VS_STAT_FIELD(peak_bytes_mapped) VS_STAT_FIELD(vmm_calls) VS_STAT_FIELD(vmm_ns) VS_STAT_FIELD(syncs)
  VS_STAT_FIELD(trims) VS_STAT_FIELD(pools)
#undef VS_STAT_FIELD
  out_fmt(o, "},\"devices\":[");
  for (int i = 0; i < sums.n; i++) {
    const vs_dev_sum_t *d = &sums.d[i];
    out_fmt(o, "%s{\"device\":%d", i ? "," : "", d->dev);
    kv_u64(o, "live", vs_heaps_sum(d->f.live));
    kv_u64(o, "mapped", vs_heaps_sum(d->f.mapped));
    kv_u64(o, "idle", vs_heaps_sum(d->f.idle));
    kv_u64(o, "pending", vs_heaps_sum(d->f.pending));
    kv_u64(o, "handles", d->f.handles);
    kv_u64(o, "blocks", d->f.live_blocks);
    kv_int(o, "pools", d->pools);
    kv_u64(o, "on_device", d->device);
    kv_u64(o, "host_copied", d->host_copied);
    kv_u64(o, "host_mapped", d->host_mapped);
    kv_u64(o, "discarded", d->discarded);
    out_fmt(o, "}");
  }
  out_fmt(o, "],\"tags\":[");
  for (int i = 0; i < nt; i++) {
    const vmmshim_tag_stats_t *t = &tags[i];
    out_fmt(o, "%s{\"name\":", i ? "," : "");
    out_str(o, t->name);
    kv_u64(o, "live", t->live);
    kv_u64(o, "device", t->device);
    kv_u64(o, "host_copied", t->host_copied);
    kv_u64(o, "host_mapped", t->host_mapped);
    kv_u64(o, "discarded", t->discarded);
    kv_bool(o, "asleep", t->asleep);
    kv_bool(o, "keep", t->keep);
    out_fmt(o, "}");
  }
  out_fmt(o, "]");
}

typedef struct vs_verb_s {
  const char *name;
  void (*fn)(const vs_jobject_t *req, vs_jout_t *o);
} vs_verb_t;

static const vs_verb_t vs_verbs[] = {
    {"status", do_status}, {"tag", do_tag},   {"sleep", do_sleep}, {"wake", do_wake},
    {"trim", do_trim},     {"limit", do_limit}, {"dump", do_dump}, {"release-host", do_release_host},
    {"promote", do_promote},
};

static atomic_bool vs_ctl_exiting; /* set at exit: what arrives then is refused */

/* One request line (newline removed) into a reply in o (its newline added). */
static void answer(const char *line, size_t len, vs_jout_t *o) {
  static vs_jobject_t req; /* the server thread's alone */
  vs_jparse_t ps;
  o->n = 0;
  o->full = false;
  if (!parse_request(line, len, &req, &ps)) {
    reply_error(o, NULL, EPROTO, "not a request: %s", ps.err);
  } else {
    const vs_jmember_t *v = jget(&req, "v"), *cmd = jget(&req, "cmd");
    if (!v || v->type != J_INT) {
      reply_error(o, &req, EPROTO, "'v' (the protocol version, %d) is missing or not a number", VS_CTL_VERSION);
    } else if (v->num != VS_CTL_VERSION) {
      reply_error(o, &req, EPROTO, "protocol version %lld is not spoken here (this shim speaks %d)", v->num,
                  VS_CTL_VERSION);
    } else if (!cmd || cmd->type != J_STR) {
      reply_error(o, &req, EINVAL, "'cmd' (the verb, a string) is missing");
    } else if (atomic_load(&vs_ctl_exiting)) {
      reply_error(o, &req, ESRCH, "the program is exiting");
    } else {
      const vs_verb_t *verb = NULL;
      for (size_t i = 0; i < sizeof vs_verbs / sizeof vs_verbs[0]; i++)
        if (!strcmp(cmd->str, vs_verbs[i].name)) verb = &vs_verbs[i];
      if (verb) verb->fn(&req, o);
      else reply_error(o, &req, EINVAL, "unknown verb '%.40s': status, tag, sleep, wake, trim, limit, dump, "
                       "release-host, promote", cmd->str);
    }
  }
  out_fmt(o, "}\n");
  if (o->full) { /* only the dump can be that long, and it is cut first: say so rather than send half */
    reply_error(o, &req, E2BIG, "the reply is longer than %d bytes", VS_CTL_REPLY_MAX);
    out_fmt(o, "}\n");
  }
}

/* ------------------------------------------------------------------ the server */

static vs_server_t vs_ctl_server;
static pid_t vs_ctl_pid;
static vs_lock_t vs_ctl_lock = VS_LOCK_INITIALIZER(VS_RANK_CONTROL, "control"); /* the start */

static vs_srv_next_t ctl_answer(int fd, uint64_t *held, const char *req, size_t len, char *out, size_t *out_n) {
  (void)fd;
  (void)held;
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
  reply_error(&o, NULL, r[why].e, "%s", r[why].msg);
  out_fmt(&o, "}\n");
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
      .answer = ctl_answer, .refusal = ctl_refusal};
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
