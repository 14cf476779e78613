/* control_json.c: the control channel's requests and replies (include/vmmshim/control.h). A
 * request is one flat JSON object; a reply is written into a fixed buffer that says when it is
 * full rather than cut a line in two. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "vmmshim/control.h"

/* ------------------------------------------------------------------ requests: flat JSON objects */

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
bool _vs_ctl_parse(const char *line, size_t len, vs_jobject_t *o, vs_jparse_t *ps) {
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

const vs_jmember_t *_vs_ctl_get(const vs_jobject_t *o, const char *key) {
  for (int i = 0; i < o->n; i++)
    if (!strcmp(o->m[i].key, key)) return &o->m[i];
  return NULL;
}

/* ------------------------------------------------------------------ replies */

void _vs_ctl_out(vs_jout_t *o, const char *fmt, ...) {
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
void _vs_ctl_out_str_n(vs_jout_t *o, const char *s, size_t max) {
  _vs_ctl_out(o, "\"");
  size_t n = s ? strnlen(s, max) : 0;
  for (size_t i = 0, k; i < n && !o->full; i += k ? k : 1) {
    unsigned char c = (unsigned char)s[i];
    k = utf8_len((const unsigned char *)s + i, n - i);
    if (k > 1) _vs_ctl_out(o, "%.*s", (int)k, s + i);
    else if (!k) _vs_ctl_out(o, "\\ufffd");
    else if (c == '"' || c == '\\') _vs_ctl_out(o, "\\%c", c);
    else if (c == '\n') _vs_ctl_out(o, "\\n");
    else if (c < 0x20 || c == 0x7f) _vs_ctl_out(o, "\\u%04x", c);
    else _vs_ctl_out(o, "%c", c);
  }
  _vs_ctl_out(o, "\"");
}
void _vs_ctl_out_str(vs_jout_t *o, const char *s) { _vs_ctl_out_str_n(o, s, (size_t)-1); }

void _vs_ctl_kv_u64(vs_jout_t *o, const char *k, uint64_t v) { _vs_ctl_out(o, ",\"%s\":%llu", k, (unsigned long long)v); }
void _vs_ctl_kv_int(vs_jout_t *o, const char *k, long long v) { _vs_ctl_out(o, ",\"%s\":%lld", k, v); }
void _vs_ctl_kv_bool(vs_jout_t *o, const char *k, bool v) { _vs_ctl_out(o, ",\"%s\":%s", k, v ? "true" : "false"); }
void _vs_ctl_kv_str(vs_jout_t *o, const char *k, const char *v) {
  _vs_ctl_out(o, ",\"%s\":", k);
  _vs_ctl_out_str(o, v);
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
void _vs_ctl_reply_begin(vs_jout_t *o, bool ok, const vs_jobject_t *req) {
  _vs_ctl_out(o, "{\"v\":%d,\"ok\":%s", VS_CTL_VERSION, ok ? "true" : "false");
  const vs_jmember_t *id = req ? _vs_ctl_get(req, "id") : NULL;
  if (id && id->type == J_INT) _vs_ctl_kv_int(o, "id", id->num);
  else if (id && id->type == J_STR) _vs_ctl_kv_str(o, "id", id->str);
}

void _vs_ctl_error(vs_jout_t *o, const vs_jobject_t *req, int e, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  o->n = 0;
  o->full = false;
  _vs_ctl_reply_begin(o, false, req);
  _vs_ctl_kv_str(o, "error", errno_name(e));
  _vs_ctl_kv_int(o, "errno", e);
  _vs_ctl_kv_str(o, "message", msg);
}

/* ------------------------------------------------------------------ the verbs */

bool _vs_ctl_arg_str(const vs_jobject_t *req, const char *key, bool required, const char **out, vs_jout_t *o) {
  const vs_jmember_t *m = _vs_ctl_get(req, key);
  *out = NULL;
  if (!m || m->type == J_NULL) {
    if (required) _vs_ctl_error(o, req, EINVAL, "'%s' is missing", key);
    return !required;
  }
  if (m->type != J_STR) {
    _vs_ctl_error(o, req, EINVAL, "'%s' must be a string", key);
    return false;
  }
  *out = m->str;
  return true;
}

bool _vs_ctl_arg_bool(const vs_jobject_t *req, const char *key, bool *out, vs_jout_t *o) {
  const vs_jmember_t *m = _vs_ctl_get(req, key);
  *out = false;
  if (!m || m->type == J_NULL) return true;
  if (m->type != J_BOOL) {
    _vs_ctl_error(o, req, EINVAL, "'%s' must be true or false", key);
    return false;
  }
  *out = m->b;
  return true;
}

/* A size: a whole number of bytes, or a string as VMMSHIM_LIMIT takes ("8G", "512M"); "none": 0. */
bool _vs_ctl_arg_size(const vs_jobject_t *req, const char *key, bool required, uint64_t *out, vs_jout_t *o) {
  const vs_jmember_t *m = _vs_ctl_get(req, key);
  *out = 0;
  if (!m || m->type == J_NULL) {
    if (required) _vs_ctl_error(o, req, EINVAL, "'%s' is missing", key);
    return !required;
  }
  if (m->type == J_INT && m->num >= 0) {
    *out = (uint64_t)m->num;
    return true;
  }
  if (m->type == J_STR && (!strcmp(m->str, "none") || _vs_parse_size(m->str, out) == 0)) return true;
  _vs_ctl_error(o, req, EINVAL, "'%s' must be a size: bytes, or a string such as \"8G\" or \"none\"", key);
  return false;
}

/* The tag of a sleep or wake: "tag": NAME, or "all": true (NULL). */
bool _vs_ctl_arg_target(const vs_jobject_t *req, const char **tag, bool *all, vs_jout_t *o) {
  if (!_vs_ctl_arg_str(req, "tag", false, tag, o) || !_vs_ctl_arg_bool(req, "all", all, o)) return false;
  if (*tag && *all) {
    _vs_ctl_error(o, req, EINVAL, "give 'tag' or 'all', not both");
    return false;
  }
  if (!*tag && !*all) {
    _vs_ctl_error(o, req, EINVAL, "'tag' (a name) or 'all': true is missing");
    return false;
  }
  if (*tag && !_vs_tag_name_ok(*tag)) {
    _vs_ctl_error(o, req, EINVAL, "'%s' is not a tag name (1-31 of A-Z a-z 0-9 _ . -)", *tag);
    return false;
  }
  return true;
}
