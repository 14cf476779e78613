/* strings.c: the trace's string table (the files and functions of Python frames).
 *
 * Each distinct string is kept once, immutable, under an id (1, 2, ...), as stacks.c keeps the
 * stacks: published with a release store and never changed afterwards, so the trace's drain
 * reads it with an acquire load and no lock. New strings come from pyframes.c under the stacks
 * lock (stacks.c), which serialises the writers. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/stacks.h"

typedef struct vs_string_s {
  uint64_t hash;
  uint32_t len;
  char text[];
} vs_string_t;

static vs_string_t *vs_strings[VS_STRINGS_MAX + 1];
static atomic_uint vs_nstrings;
#define VS_STRING_SLOTS (1u << 17)
static uint32_t *vs_string_slots; /* open addressing: string ids; under the stacks lock */

uint64_t _vs_hash_bytes(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

bool _vs_strings_open(void) {
  if (!vs_string_slots) vs_string_slots = calloc(VS_STRING_SLOTS, sizeof *vs_string_slots);
  return vs_string_slots != NULL;
}

const char *_vs_string_get(uint32_t id) {
  return id && id <= atomic_load_explicit(&vs_nstrings, memory_order_acquire) ? vs_strings[id]->text : NULL;
}

uint32_t _vs_string_intern(const char *s, size_t len) {
  if (!vs_string_slots) return 0;
  uint64_t h = _vs_hash_bytes(s, len, 0xcbf29ce484222325ull);
  for (uint32_t i = (uint32_t)h & (VS_STRING_SLOTS - 1);; i = (i + 1) & (VS_STRING_SLOTS - 1)) {
    uint32_t id = vs_string_slots[i];
    if (!id) break;
    const vs_string_t *e = vs_strings[id];
    if (e->hash == h && e->len == len && !memcmp(e->text, s, len)) return id;
  }
  unsigned n = atomic_load_explicit(&vs_nstrings, memory_order_relaxed);
  if (n >= VS_STRINGS_MAX) return 0;
  vs_string_t *e = malloc(sizeof *e + len + 1);
  if (!e) return 0;
  e->hash = h;
  e->len = (uint32_t)len;
  for (size_t i = 0; i < len; i++) e->text[i] = s[i] == '\n' ? ' ' : s[i];
  e->text[len] = 0;
  vs_strings[n + 1] = e;
  for (uint32_t i = (uint32_t)h & (VS_STRING_SLOTS - 1);; i = (i + 1) & (VS_STRING_SLOTS - 1))
    if (!vs_string_slots[i]) {
      vs_string_slots[i] = n + 1;
      break;
    }
  atomic_store_explicit(&vs_nstrings, n + 1, memory_order_release);
  return n + 1;
}
