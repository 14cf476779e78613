/* Call stacks of traced allocations (stacks.c, pyframes.c), as the trace's drain reads them.
 *
 * Each distinct stack is kept once, immutable, under an id (1, 2, ...); an allocation's trace
 * record carries the id. The loaded modules its native frames lie in and the strings of its
 * Python frames are kept the same way. Everything here is published with release stores and
 * never changed afterwards, so the drain (which may run in a signal handler) reads it with
 * acquire loads and no lock. */
#ifndef VMMSHIM_STACKS_H
#define VMMSHIM_STACKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VS_STACK_FRAMES_MAX 64 /* VMMSHIM_TRACE_STACKS at most */
#define VS_STACKS_MAX 32767    /* distinct stacks kept; later new ones get no id */
#define VS_MODULES_MAX 4095
#define VS_STRINGS_MAX 65535

typedef struct vs_pyframe_s {
  uint32_t file, func; /* string ids */
  uint32_t line;
} vs_pyframe_t;

typedef struct vs_stack_s {
  uint64_t hash;
  uint32_t id;
  uint16_t nnative, npy;
  const uintptr_t *ips;       /* nnative return addresses, innermost first */
  const uint16_t *modules;    /* the module id of each (0: in no known module) */
  const vs_pyframe_t *py;     /* npy Python frames, innermost first */
} vs_stack_t;

typedef struct vs_module_s {
  uintptr_t lo, hi, bias; /* loadable segments [lo, hi); file address = run-time address - bias */
  char buildid[41];       /* lower-case hex of the GNU build-id note, "" when it has none */
  const char *path;
} vs_module_t;

extern int _vs_stacks_on; /* checked before capturing: VMMSHIM_TRACE_STACKS > 0 and tracing */

/* At trace open: reads the options, picks the unwinder, notes the shim's own range. */
void _vs_stacks_open(void);
/* The stack of the calling thread for an allocation of `requested` bytes: its id, or 0 when
 * not sampled (VMMSHIM_TRACE_STACKS_MIN / _SAMPLE) or the table is full. */
uint32_t _vs_stack_capture(size_t requested);
/* Published entries by id (NULL when there is none). */
const vs_stack_t *_vs_stack_get(uint32_t id);
const vs_module_t *_vs_module_get(uint32_t id);
const char *_vs_string_get(uint32_t id); /* strings.c */
/* The capture settings, for the trace header: frames, minimum size, sampling. */
void _vs_stacks_settings(unsigned *frames, uint64_t *min_size, unsigned *sample);
/* This program's file (/proc/self/exe) into buf, NUL-terminated (cut to cap - 1 bytes): its
 * length, 0 (and "") when it cannot be read. */
size_t _vs_self_exe(char *buf, size_t cap);

/* pyframes.c: the calling thread's Python frames (found with dlsym; nothing is linked).
 * _vs_pyframes_enter makes sure the thread holds its interpreter's GIL: it returns 0 when the
 * thread already holds it, 1 when it took it (the thread had released it around a C call, as
 * PyTorch does around every operator; VMMSHIM_TRACE_PYTHON=on only), -1 when there are no
 * frames to read (no Python, a thread that never ran Python, the interpreter finalizing, or
 * the GIL released and VMMSHIM_TRACE_PYTHON=held). Called before the stacks lock is taken (the
 * GIL comes first, always). _vs_pyframes then writes the frames to out (innermost first) and
 * returns how many, under the stacks lock; _vs_pyframes_leave(token) gives back a GIL taken. */
int _vs_pyframes_enter(void);
int _vs_pyframes(vs_pyframe_t *out, int max);
void _vs_pyframes_leave(int token);
bool _vs_pyframes_open(int mode); /* false: no CPython in the process, or mode off */
bool _vs_pyframes_wait(void);     /* whether a thread that released the GIL takes it back */
/* For tag rules (src/alloc/rules.c), outside tracing. _vs_stack_walk: the calling thread's return
 * addresses, the shim's own frames dropped, innermost first (the unwinder of
 * VMMSHIM_TRACE_UNWIND, picked on first use); returns how many (at most max). */
int _vs_stack_walk(void **out, int max);
/* The innermost Python frame's code object of the calling thread (a key only: never
 * dereferenced), NULL when there is none to read (as _vs_pyframes_enter says). */
const void *_vs_pyframe_code(void);
/* Its file (co_filename) and function (co_qualname, else co_name) into file and func; the code
 * object is kept alive from then on, so that its address stays its own as a key. */
void _vs_pyframe_names(const void *code, char *file, size_t nf, char *func, size_t nfn);
/* strings.c: a string's id (kept once), for pyframes.c; 0 when the table is full. The stacks
 * lock held. */
uint32_t _vs_string_intern(const char *s, size_t len);
bool _vs_strings_open(void); /* at the stacks' open: false when there is no memory for the table */
/* FNV-1a of n bytes, continued from h: the string and stack tables' hash. */
uint64_t _vs_hash_bytes(const void *p, size_t n, uint64_t h);

#endif
