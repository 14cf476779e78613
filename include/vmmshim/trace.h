/* The trace's own types, shared by trace.c (the ring: taking, publishing and draining
 * records, the file, signals, fork) and trace_format.c (records into text lines). */
#ifndef VMMSHIM_TRACE_H
#define VMMSHIM_TRACE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define VS_TRACE_FORMAT_VERSION 4
#define VS_TRACE_REC_MAX 192 /* longest line: 'm' with ten 16-digit fields */
#define VS_TRACE_RULE_TEXT 100 /* 'j': bytes of the rule's text kept (with the rest, within REC_MAX) */
#define VS_TRACE_STACK_MAX 3072 /* 'k': 64 native frames and 64 Python frames */
#define VS_TRACE_MODULE_MAX 4300 /* 'l': four numbers, a build id and a path of up to 4096 */
#define VS_TRACE_STRING_MAX 4200 /* 'n': strings are cut at 4096 bytes */
#define VS_TRACE_HEADER_MAX 4096

/* One event, as the hot path leaves it. seq == pos: the slot is free for the record at
 * position pos; seq == pos + 1: that record is published. The fields by record type:
 *   'a' alloc: a ptr, b requested, c served, d stream, e stack id (0: none), sub api
 *   'f' free:  a ptr, c served, d stream, sub api
 *   'o' failed allocation: b requested, d stream, e CUresult, sub api
 *   'm' pool event: a va, b size, c handle, d duration ns, e CUresult, sub op, flags
 *       (VS_TRACE_HOST_MEMORY in flags: a host buffer's mapping, not device memory;
 *       VS_TRACE_ALIAS: a second mapping of a device handle, not more device memory)
 *   'g' tag name: a-d the name (up to 31 bytes, zero-padded), e the tag's index
 *   'h' stitch: a va, b size, c bytes in new handles, d duration ns, e handles mapped
 *   'w' sleep or wake: sub 0 sleep, 1 wake, a device bytes given back or mapped again, b bytes
 *       copied to or from host memory, c the tag's index (~0: every tag), d duration ns,
 *       e the result (0, or a negative errno value), flags the mode
 *   'j' tag rule: sub the rule's index, a ptr, c its tag's name, d its text (both char *, kept
 *       for the life of the process)
 *   'b' a group operation seen by this member: sub its kind (VS_TRACE_GROUP_*), a the other
 *       member's pid (0: none), b bytes, d duration ns, e the result (0, or a negative errno) */
enum {
  VS_TRACE_GROUP_QUIESCE = 0, /* a group's phase 1: the gate held (src/hook/control_group.c) */
  VS_TRACE_GROUP_RELEASE = 1, /* the hold ended by the client's release */
  VS_TRACE_GROUP_LEASE = 2,   /* ... by its lease running out */
  VS_TRACE_GROUP_CLOSED = 3,  /* ... by the close of the client's connection */
  VS_TRACE_GROUP_LENT = 4,    /* a cold tag lent to a higher member (src/alloc/balloon.c) */
  VS_TRACE_GROUP_RETURNED = 5, /* lent memory back on the device */
  VS_TRACE_GROUP_BORROWED = 6 /* a growth that lower members made room for (src/alloc/limit.c) */
};
#define VS_TRACE_HOST_MEMORY 0x80
#define VS_TRACE_ALIAS 0x40
typedef struct vs_trace_rec_s {
  _Alignas(64) atomic_uint_least64_t seq;
  uint64_t t; /* raw clock reading (clock.h); made ns when drained */
  uint64_t a, b, c, d;
  uint32_t tid, e;
  int32_t dev;
  uint8_t type, sub, flags;
} vs_trace_rec_t;

/* What a line needs besides its record: the format and the time origin. */
typedef struct vs_trace_fmt_s {
  int format;      /* vs_trace_format_t */
  uint64_t mono0;  /* CLOCK_MONOTONIC ns at open: record times count from it */
  uint64_t real0;  /* CLOCK_REALTIME ns at open */
  int64_t tzoff;   /* local time offset (s), for the rmm clock */
} vs_trace_fmt_t;

void _vs_trace_format_init(void);
/* One record as one line (at most VS_TRACE_REC_MAX bytes) at p; returns its end. mono_ns:
 * the record's time in CLOCK_MONOTONIC ns. Async-signal-safe (static tables, the stack). */
char *_vs_trace_format_record(char *p, const vs_trace_rec_t *r, uint64_t mono_ns, const vs_trace_fmt_t *f);
/* The header lines (native: v, x, c, p, s; rmm: the CSV header) into h; returns the length. */
size_t _vs_trace_format_header(char *h, size_t cap, const vs_trace_fmt_t *f, const char *rank);
struct vs_stack_s;
struct vs_module_s;
/* 'k', 'l' and 'n' lines (stacks.h): at most VS_TRACE_STACK_MAX, _MODULE_MAX, _STRING_MAX bytes. */
char *_vs_trace_format_stack(char *p, const struct vs_stack_s *s);
char *_vs_trace_format_module(char *p, uint32_t id, const struct vs_module_s *m);
char *_vs_trace_format_string(char *p, uint32_t id, const char *text);
/* The native format's closing line ('e'); returns its end. */
char *_vs_trace_format_end(char *p, uint64_t mono_ns, const vs_trace_fmt_t *f);

#endif
