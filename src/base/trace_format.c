/* trace_format.c: trace records into text lines, for the native format (README.md "Trace
 * format", version VS_TRACE_FORMAT_VERSION) and RAPIDS RMM's CSV log. Numbers are formatted
 * by hand into the caller's buffer: the drain runs in signal handlers too, where no stdio
 * is allowed (the header, written at open, is the one place snprintf is used). */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/base.h"
#include "vmmshim/stacks.h"
#include "vmmshim/trace.h"

static const char vs_hex[16] = "0123456789abcdef";

/* Two digits per step from a 512-byte table: half the loop of one digit at a time. */
static char vs_hex2[256][2];

void _vs_trace_format_init(void) {
  for (int i = 0; i < 256; i++) {
    vs_hex2[i][0] = vs_hex[i >> 4];
    vs_hex2[i][1] = vs_hex[i & 15];
  }
}

static inline char *put_hex(char *p, uint64_t v) {
  if (v == 0) {
    *p++ = '0';
    return p;
  }
  unsigned digits = (unsigned)(67 - __builtin_clzll(v)) / 4;
  char *end = p + digits, *q = end;
  while (q - p >= 2) {
    q -= 2;
    memcpy(q, vs_hex2[v & 0xff], 2);
    v >>= 8;
  }
  if (q > p) *--q = vs_hex[v & 15];
  return end;
}

static inline char *put_dec(char *p, uint64_t v) {
  char tmp[20];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

static inline char *put_sp_hex(char *p, uint64_t v) {
  *p++ = ' ';
  return put_hex(p, v);
}

/* Streams: "-" for the synchronous sentinel. Devices: "-" when unknown (< 0). */
static inline char *put_sp_stream(char *p, uint64_t s) {
  *p++ = ' ';
  if (s == (uint64_t)(uintptr_t)VS_NO_STREAM) {
    *p++ = '-';
    return p;
  }
  return put_hex(p, s);
}

static inline char *put_sp_dev(char *p, int d) {
  *p++ = ' ';
  if (d < 0) {
    *p++ = '-';
    return p;
  }
  return put_hex(p, (uint64_t)d);
}

static char *put_str(char *p, const char *s) {
  while (*s) *p++ = *s++;
  return p;
}

/* rmm: "<tid>,<HH:MM:SS.uuuuuu>," as spdlog's "%t,%H:%M:%S.%f," (local time). */
static char *rmm_head(char *p, uint32_t tid, uint64_t mono, const vs_trace_fmt_t *f) {
  p = put_dec(p, tid);
  *p++ = ',';
  uint64_t real = mono - f->mono0 + f->real0;
  int64_t secs = (int64_t)(real / 1000000000ull) + f->tzoff;
  unsigned day = (unsigned)(((secs % 86400) + 86400) % 86400);
  unsigned us = (unsigned)((real / 1000u) % 1000000u);
  unsigned hms[3] = {day / 3600, day / 60 % 60, day % 60};
  for (int i = 0; i < 3; i++) {
    *p++ = (char)('0' + hms[i] / 10);
    *p++ = (char)('0' + hms[i] % 10);
    *p++ = i < 2 ? ':' : '.';
  }
  for (unsigned div = 100000; div; div /= 10) *p++ = (char)('0' + us / div % 10);
  *p++ = ',';
  return p;
}

static char *rmm_tail(char *p, uint64_t ptr, uint64_t size, uint64_t stream) {
  *p++ = '0';
  *p++ = 'x';
  p = put_hex(p, ptr);
  *p++ = ',';
  p = put_dec(p, size);
  *p++ = ',';
  *p++ = '0';
  *p++ = 'x';
  p = put_hex(p, stream == (uint64_t)(uintptr_t)VS_NO_STREAM ? 0 : stream);
  *p++ = '\n';
  return p;
}

/* The columns after DEV of each record type, in order: a-e the record's fields, F its flags, S
 * the stream in d (docs/trace-format.md). 'g', a library's name in 'r' and 'j' write text. */
static const char *columns_of(int type) {
  switch (type) {
  case 'a': return "Sabce";
  case 'f': return "Sac";
  case 'o': return "Sbe";
  case 'b': return "abed";
  case 'u': return "abce";
  case 'r': return "abe";
  case 'w': return "cFabed";
  case 'h': return "abecd"; /* a stitch: va, size, handles, fresh bytes, duration */
  default: return "abcFed"; /* 'm' */
  }
}

static char *put_columns(char *p, const vs_trace_rec_t *r, const char *cols) {
  for (; *cols; cols++) {
    switch (*cols) {
    case 'S': p = put_sp_stream(p, r->d); break;
    case 'F': p = put_sp_hex(p, r->flags); break;
    case 'a': p = put_sp_hex(p, r->a); break;
    case 'b': p = put_sp_hex(p, r->b); break;
    case 'c': p = put_sp_hex(p, r->c); break;
    case 'd': p = put_sp_hex(p, r->d); break;
    default: p = put_sp_hex(p, r->e); break;
    }
  }
  return p;
}

/* 'g' and a library's name in 'r': e, then the name kept in a-d (up to 31 bytes). */
static char *put_index_name(char *p, const vs_trace_rec_t *r) {
  char name[33];
  memcpy(name, &r->a, 8), memcpy(name + 8, &r->b, 8), memcpy(name + 16, &r->c, 8), memcpy(name + 24, &r->d, 8);
  name[32] = 0;
  p = put_sp_hex(p, r->e);
  *p++ = ' ';
  for (int i = 0; name[i] && i < 31; i++) *p++ = name[i];
  return p;
}

/* 'j': the pointer, the tag's name, then the rule's text: the rest of the line, cut at
 * VS_TRACE_RULE_TEXT. */
static char *put_rule(char *p, const vs_trace_rec_t *r) {
  const char *tag = (const char *)(uintptr_t)r->c, *text = (const char *)(uintptr_t)r->d;
  p = put_sp_hex(p, r->a);
  *p++ = ' ';
  for (int i = 0; tag[i] && i < 31; i++) *p++ = tag[i];
  *p++ = ' ';
  for (int i = 0; text[i] && i < VS_TRACE_RULE_TEXT; i++) *p++ = text[i] == '\n' ? ' ' : text[i];
  return p;
}

char *_vs_trace_format_record(char *p, const vs_trace_rec_t *r, uint64_t mono, const vs_trace_fmt_t *f) {
  if (f->format == VS_TRACE_RMM) {
    p = rmm_head(p, r->tid, mono, f);
    if (r->type == 'a') return rmm_tail(put_str(p, "allocate,"), r->a, r->c, r->d);
    if (r->type == 'f') return rmm_tail(put_str(p, "free,"), r->a, r->c, r->d);
    return rmm_tail(put_str(p, "allocate failure,"), 0, r->b, r->d);
  }
  *p++ = (char)r->type;
  p = put_sp_hex(p, mono > f->mono0 ? mono - f->mono0 : 0);
  p = put_sp_hex(p, r->tid);
  p = put_sp_hex(p, r->sub);
  p = put_sp_dev(p, r->dev);
  if (r->type == 'g' || (r->type == 'r' && r->sub == VS_RESIDUE_NAME)) p = put_index_name(p, r);
  else if (r->type == 'j') p = put_rule(p, r);
  else p = put_columns(p, r, columns_of(r->type));
  *p++ = '\n';
  return p;
}

/* At most `max` bytes of s (no newline inside: the writers replaced them). */
static char *put_text(char *p, const char *s, size_t max) {
  for (size_t i = 0; s[i] && i < max; i++) *p++ = s[i];
  return p;
}

char *_vs_trace_format_stack(char *p, const vs_stack_t *s) {
  *p++ = 'k';
  p = put_sp_hex(p, s->id);
  p = put_sp_hex(p, s->nnative);
  p = put_sp_hex(p, s->npy);
  for (unsigned i = 0; i < s->nnative; i++) p = put_sp_hex(p, s->ips[i]);
  for (unsigned i = 0; i < s->npy; i++) {
    p = put_sp_hex(p, s->py[i].file);
    p = put_sp_hex(p, s->py[i].func);
    p = put_sp_hex(p, s->py[i].line);
  }
  *p++ = '\n';
  return p;
}

char *_vs_trace_format_module(char *p, uint32_t id, const vs_module_t *m) {
  *p++ = 'l';
  p = put_sp_hex(p, id);
  p = put_sp_hex(p, m->lo);
  p = put_sp_hex(p, m->hi);
  p = put_sp_hex(p, m->bias);
  *p++ = ' ';
  p = m->buildid[0] ? put_str(p, m->buildid) : put_str(p, "-");
  *p++ = ' ';
  p = put_text(p, m->path ? m->path : "?", 4096);
  *p++ = '\n';
  return p;
}

char *_vs_trace_format_string(char *p, uint32_t id, const char *text) {
  *p++ = 'n';
  p = put_sp_hex(p, id);
  *p++ = ' ';
  p = put_text(p, text, 4096);
  *p++ = '\n';
  return p;
}

char *_vs_trace_format_end(char *p, uint64_t mono, const vs_trace_fmt_t *f) {
  *p++ = 'e';
  p = put_sp_hex(p, mono > f->mono0 ? mono - f->mono0 : 0);
  *p++ = '\n';
  return p;
}

size_t _vs_trace_format_header(char *h, size_t cap, const vs_trace_fmt_t *f, const char *rank) {
  if (f->format == VS_TRACE_RMM) {
    static const char hdr[] = "Thread,Time,Action,Pointer,Size,Stream\n";
    size_t n = sizeof hdr - 1 < cap ? sizeof hdr - 1 : cap;
    memcpy(h, hdr, n);
    return n;
  }
  size_t n = 0;
  n += (size_t)snprintf(h + n, cap - n, "v %x vmmshim %s\n", VS_TRACE_FORMAT_VERSION, VMMSHIM_VERSION);
  char exe[PATH_MAX];
  size_t k = _vs_self_exe(exe, sizeof exe);
  for (size_t i = 0; i < k; i++)
    if (exe[i] == '\n') exe[i] = '?';
  if (n < cap) n += (size_t)snprintf(h + n, cap - n, "x %s\n", exe);
  /* The command line: arguments separated by one space (a newline inside becomes a space). */
  char cmd[2048];
  size_t c = 0;
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t r;
    while (c < sizeof cmd - 1 && (r = read(fd, cmd + c, sizeof cmd - 1 - c)) > 0) c += (size_t)r;
    close(fd);
  }
  while (c > 0 && cmd[c - 1] == '\0') c--;
  for (size_t i = 0; i < c; i++)
    if (cmd[i] == '\0' || cmd[i] == '\n' || cmd[i] == '\r') cmd[i] = ' ';
  cmd[c] = '\0';
  if (n < cap) n += (size_t)snprintf(h + n, cap - n, "c %s\n", cmd);
  long rk = strtol(rank, NULL, 10);
  if (n < cap)
    n += (size_t)snprintf(h + n, cap - n, "p %x %x %lx\n", (unsigned)getpid(), (unsigned)getppid(),
                          (unsigned long)(rk < 0 ? 0 : rk));
  if (n < cap)
    n += (size_t)snprintf(h + n, cap - n, "s %llx %llx\n", (unsigned long long)f->real0,
                          (unsigned long long)f->mono0);
  return n > cap ? cap : n;
}
