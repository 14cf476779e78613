/* vmmshim control channel (src/hook/control*.c): the request and reply helpers its verbs share.
 * control.c serves the channel and holds the table of verbs; control_json.c parses a request
 * (one flat JSON object) and writes a reply; each verb checks its arguments with _vs_ctl_arg_*,
 * which write the error reply themselves and return false. */
#ifndef VMMSHIM_CONTROL_H
#define VMMSHIM_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vmmshim/alloc.h"

#define VS_CTL_VERSION 1
#define VS_CTL_MAX_MEMBERS 16
#define VS_CTL_STR_MAX 256

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

typedef struct vs_jout_s {
  char *buf;
  size_t cap, n;
  bool full;
} vs_jout_t;

typedef struct vs_jparse_s {
  const char *start, *p, *end;
  char err[128];
} vs_jparse_t;


/* ---------------------------------------------------------------- "control_json.c" */
/* A request line (len bytes, no newline) into o; false with ps->err saying why. */
bool _vs_ctl_parse(const char *line, size_t len, vs_jobject_t *o, vs_jparse_t *ps);
/* The member named key, or NULL. */
const vs_jmember_t *_vs_ctl_get(const vs_jobject_t *o, const char *key);

void _vs_ctl_out(vs_jout_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void _vs_ctl_out_str_n(vs_jout_t *o, const char *s, size_t max);
void _vs_ctl_out_str(vs_jout_t *o, const char *s);
void _vs_ctl_kv_u64(vs_jout_t *o, const char *k, uint64_t v);
void _vs_ctl_kv_int(vs_jout_t *o, const char *k, long long v);
void _vs_ctl_kv_bool(vs_jout_t *o, const char *k, bool v);
void _vs_ctl_kv_str(vs_jout_t *o, const char *k, const char *v);
/* What every reply starts with: the version, whether the request was done, and its id. */
void _vs_ctl_reply_begin(vs_jout_t *o, bool ok, const vs_jobject_t *req);
/* The reply, emptied, becomes an error: errno e by name and number, and the message. */
void _vs_ctl_error(vs_jout_t *o, const vs_jobject_t *req, int e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Arguments: true when present and well formed (or absent and not required); else false, with
 * the error reply written. */
bool _vs_ctl_arg_str(const vs_jobject_t *req, const char *key, bool required, const char **out, vs_jout_t *o);
bool _vs_ctl_arg_bool(const vs_jobject_t *req, const char *key, bool *out, vs_jout_t *o);
/* A size: a whole number of bytes, or a string as VMMSHIM_LIMIT takes ("8G", "512M"); "none": 0. */
bool _vs_ctl_arg_size(const vs_jobject_t *req, const char *key, bool required, uint64_t *out, vs_jout_t *o);
/* The tag of a sleep or wake: "tag": NAME, or "all": true (*tag NULL). */
bool _vs_ctl_arg_target(const vs_jobject_t *req, const char **tag, bool *all, vs_jout_t *o);

/* ---------------------------------------------------------------- "control_rules.c" */
/* The `rules` verb; and ,"rules":[...] (the rules in force and their counts), for status. */
void _vs_ctl_rules(const vs_jobject_t *req, vs_jout_t *o);
void _vs_ctl_out_rules(vs_jout_t *o);

/* ---------------------------------------------------------------- "control.c" */
/* The connection the request being answered came on: a number of its own, never 0. */
uint64_t _vs_ctl_connection(void);

/* ---------------------------------------------------------------- "control_group.c" */
/* A group's phase 1 (quiesce: the gate held, with a lease) and its end (release). */
void _vs_ctl_quiesce(const vs_jobject_t *req, vs_jout_t *o);
void _vs_ctl_release(const vs_jobject_t *req, vs_jout_t *o);
/* Ballooning: a member's priority, its cold tags, a higher member's request for room. */
void _vs_ctl_priority(const vs_jobject_t *req, vs_jout_t *o);
void _vs_ctl_cold(const vs_jobject_t *req, vs_jout_t *o);
void _vs_ctl_demote(const vs_jobject_t *req, vs_jout_t *o);
/* A connection closed: a hold it took ends. */
void _vs_ctl_group_closed(uint64_t conn);

#endif
