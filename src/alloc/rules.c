/* rules.c: tags without code (VMMSHIM_TAG_RULES, docs/tag-rules.md).
 *
 * An ordered list of TAG=MATCHER rules; the first that matches an allocation gives its tag.
 * Rules apply to threads that set no tag of their own (vmmshim_set_tag and regions win: the
 * code knows best), in place of the process's tag, which stays the tag of what no rule matches.
 *
 * Cost: the allocation path loads one pointer (the rule set) and finds NULL when there are no
 * rules. A set is immutable once published: a change builds a new one and swaps the pointer, so
 * a reader sees the old set or the new one whole, with no lock. Old sets are kept for the life of
 * the process (they are small, and a reader may still be walking one; the trace's `j` records
 * point at their rules). Matchers that need no stack (size, phase, capture) are a compare each.
 * Matchers of the call site (lib, site, py) are decided once per thread and call site: a small
 * thread-local cache keyed by the allocation hook's return address, the innermost Python code
 * object when a py: rule needs it (one C site serves many Python sites), and the rule set. When
 * the return address lies in a known allocator or the CUDA runtime, it does not name the site:
 * the stack is walked on each such allocation and the first frame outside them is the key. */
#include <dlfcn.h>
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmshim/alloc.h"
#include "vmmshim/stacks.h"

#define VS_RULES_MAX 32      /* rules in a set */
#define VS_RULE_MATCHERS 8   /* matchers of one all: */
#define VS_SITE_BITS 64      /* lib, site and py matchers in a set, together */
#define VS_SITE_CACHE 256    /* per thread, direct-mapped */
#define VS_WALK_FRAMES 48

atomic_bool _vs_launched;
_Thread_local void *_vs_tl_alloc_caller;
/* The set in force: NULL for none; VS_RULES_UNREAD until VMMSHIM_TAG_RULES has been read. */
static vs_ruleset_t vs_unread;
vs_ruleset_t *_Atomic _vs_rules = &vs_unread;
static vs_ruleset_t *_Atomic vs_kept; /* every set ever published, newest first */
static pthread_once_t vs_rules_once = PTHREAD_ONCE_INIT;

/* Shared objects that allocate for others: a lib: rule looks past them to their caller. */
static const char *const vs_skip[] = {"libcudart.so*", "libcudart_static*", "libcuda.so*", "libc10_cuda.so*",
                                      "libtorch_cuda.so*", "librmm.so*", "*/cupy_backends/*", "*/cupy/cuda/*",
                                      "libxla*", "*/jaxlib/*", "*/jax_plugins/*", "libvmmshim.so*"};

/* ------------------------------------------------------------------ parsing */

static int fail(char *err, size_t n, int rule, int pos, const char *spec_rule, int len, const char *why) {
  if (err && n)
    snprintf(err, n, "rule %d ('%.*s'), at character %d: %s", rule, len > 60 ? 60 : len, spec_rule, pos, why);
  return -EINVAL;
}

/* One simple matcher [p, end) into m; NULL or the reason it is not one. */
static const char *parse_simple(const char *p, const char *end, vs_matcher_t *m, char **store) {
  size_t len = (size_t)(end - p);
  static const struct { const char *word; vs_match_kind_t kind; } fixed[] = {
      {"capture", VS_MATCH_CAPTURE}, {"phase:before-launch", VS_MATCH_BEFORE}, {"phase:after-launch", VS_MATCH_AFTER}};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    if (len == strlen(fixed[i].word) && !memcmp(p, fixed[i].word, len)) {
      m->kind = fixed[i].kind;
      return NULL;
    }
  if (len >= 6 && !memcmp(p, "phase:", 6)) return "a phase is before-launch or after-launch";
  if (len >= 5 && !memcmp(p, "size:", 5)) {
    const char *q = p + 5;
    if (end - q >= 2 && q[0] == '>' && q[1] == '=') m->kind = VS_MATCH_SIZE_GE, q += 2;
    else if (end - q >= 1 && q[0] == '<') m->kind = VS_MATCH_SIZE_LT, q += 1;
    else return "size: takes >=N or <N";
    char num[32];
    if (end - q <= 0 || end - q >= (long)sizeof num) return "size: needs a number (K, M, G, T suffixes)";
    memcpy(num, q, (size_t)(end - q));
    num[end - q] = 0;
    if (_vs_parse_size(num, &m->size) != 0) return "size: needs a number (K, M, G, T suffixes)";
    return NULL;
  }
  static const struct { const char *prefix; vs_match_kind_t kind; } globs[] = {
      {"lib:", VS_MATCH_LIB}, {"py:", VS_MATCH_PY}, {"site:", VS_MATCH_SITE}};
  for (size_t i = 0; i < sizeof globs / sizeof globs[0]; i++) {
    size_t k = strlen(globs[i].prefix);
    if (len < k || memcmp(p, globs[i].prefix, k)) continue;
    if (len == k) return "the glob is empty";
    m->kind = globs[i].kind;
    m->glob = *store;
    memcpy(*store, p + k, len - k);
    (*store)[len - k] = 0;
    *store += len - k + 1;
    return NULL;
  }
  return "unknown matcher (lib:, py:, site:, capture, phase:, size:, all:)";
}

/* One rule [p, end) (spaces trimmed) into r. */
static int parse_rule(const char *spec, const char *p, const char *end, int idx, vs_rule_t *r, char *text,
                      char **store, char *err, size_t n) {
  const char *eq = memchr(p, '=', (size_t)(end - p));
  int len = (int)(end - p);
  if (!eq) return fail(err, n, idx, (int)(end - spec) + 1, p, len, "no '=': a rule is TAG=MATCHER");
  size_t tl = (size_t)(eq - p);
  static const char bad_tag[] = "the tag is 1-31 of A-Z a-z 0-9 _ . -";
  if (tl == 0 || tl >= VMMSHIM_TAG_MAX) return fail(err, n, idx, (int)(p - spec) + 1, p, len, bad_tag);
  memcpy(r->tag_name, p, tl);
  r->tag_name[tl] = 0;
  if (!_vs_tag_name_ok(r->tag_name)) return fail(err, n, idx, (int)(p - spec) + 1, p, len, bad_tag);
  const char *m = eq + 1;
  bool all = end - m >= 4 && !memcmp(m, "all:", 4);
  if (all) m += 4;
  r->n = 0;
  for (;;) {
    const char *c = all ? memchr(m, ',', (size_t)(end - m)) : NULL;
    const char *me = c ? c : end;
    if (!all && memchr(m, ',', (size_t)(end - m))) {
      const char *bad = memchr(m, ',', (size_t)(end - m));
      return fail(err, n, idx, (int)(bad - spec) + 1, p, len, "',' joins matchers only inside all:");
    }
    if (r->n == VS_RULE_MATCHERS)
      return fail(err, n, idx, (int)(m - spec) + 1, p, len, "all: takes at most 8 matchers");
    if (me == m) return fail(err, n, idx, (int)(m - spec) + 1, p, len, "a matcher is missing");
    const char *why = parse_simple(m, me, &r->m[r->n], store);
    if (why) return fail(err, n, idx, (int)(m - spec) + 1, p, len, why);
    r->n++;
    if (!c) break;
    m = c + 1;
  }
  memcpy(text, p, (size_t)len);
  text[len] = 0;
  r->text = text;
  return 0;
}

static bool blank(char c) { return c == ' ' || c == '\t'; }

/* The whole spec into a new set (not yet published, tags not yet created); *out stays NULL for a
 * spec without a rule. */
static int parse(const char *spec, vs_ruleset_t **out, char *err, size_t n) {
  size_t sl = strlen(spec);
  if (sl > VS_RULES_SPEC_MAX)
    return fail(err, n, 1, VS_RULES_SPEC_MAX + 1, spec, 0, "the rules are at most 4095 bytes");
  /* Room for the rules, their texts and globs (each at most the spec's length). */
  vs_ruleset_t *rs = calloc(1, sizeof *rs + 3 * (sl + 1) + 128);
  if (!rs) return -ENOMEM;
  char *store = (char *)(rs + 1);
  rs->spec = store;
  memcpy(store, spec, sl + 1);
  store += sl + 1;
  int idx = 0, rc = 0, bits = 0;
  for (const char *p = spec; *p && !rc;) {
    const char *semi = strchr(p, ';'), *end = semi ? semi : p + strlen(p);
    const char *a = p, *b = end;
    while (a < b && blank(*a)) a++;
    while (b > a && blank(b[-1])) b--;
    if (a < b) {
      idx++;
      if (rs->n == VS_RULES_MAX) {
        rc = fail(err, n, idx, (int)(a - spec) + 1, a, (int)(b - a), "at most 32 rules");
        break;
      }
      vs_rule_t *r = &rs->rules[rs->n];
      r->index = rs->n;
      char *text = store;
      store += (size_t)(b - a) + 1;
      rc = parse_rule(spec, a, b, idx, r, text, &store, err, n);
      for (int k = 0; !rc && k < r->n; k++) {
        vs_matcher_t *m = &r->m[k];
        if (m->kind != VS_MATCH_LIB && m->kind != VS_MATCH_SITE && m->kind != VS_MATCH_PY) continue;
        if (bits == VS_SITE_BITS) {
          rc = fail(err, n, idx, (int)(a - spec) + 1, a, (int)(b - a), "more than 64 lib:, site: and py: matchers");
          break;
        }
        m->bit = bits++;
        rs->need_py |= m->kind == VS_MATCH_PY;
        rs->need_site |= m->kind != VS_MATCH_PY;
        rs->need_walk |= m->kind == VS_MATCH_SITE;
      }
      rs->n++;
    }
    p = semi ? semi + 1 : end;
  }
  if (rc || rs->n == 0) { /* no rule at all (only blanks and ';'): no set, the fast path */
    free(rs);
    return rc;
  }
  *out = rs;
  return 0;
}

/* ------------------------------------------------------------------ publishing */

/* Creates the set's tags; then it replaces the set in force. */
static int publish(vs_ruleset_t *rs, char *err, size_t n) {
  for (int i = 0; rs && i < rs->n; i++) {
    int id = _vs_tag_find(rs->rules[i].tag_name, true);
    if (id < 0) {
      if (err && n) snprintf(err, n, "rule %d ('%.60s'): no room for tag '%s' (a process has at most %d tags)", i + 1,
                             rs->rules[i].text, rs->rules[i].tag_name, VMMSHIM_MAX_TAGS);
      free(rs);
      return id;
    }
    rs->rules[i].tag = id;
  }
  if (rs) {
    rs->kept = atomic_load(&vs_kept);
    while (!atomic_compare_exchange_weak(&vs_kept, &rs->kept, rs)) {
    }
  }
  atomic_store_explicit(&_vs_rules, rs, memory_order_release);
  return 0;
}

int _vs_set_tag_rules(const char *spec, char *err, size_t n) {
  if (err && n) err[0] = 0;
  _vs_tags_init();
  pthread_once(&vs_rules_once, _vs_rules_init);
  vs_ruleset_t *rs = NULL;
  if (spec && *spec) {
    int rc = parse(spec, &rs, err, n);
    if (rc) return rc;
  }
  int rc = publish(rs, err, n);
  if (!rc) _vs_info("tag rules now: %s", rs && rs->n ? rs->spec : "(none)");
  return rc;
}

/* VMMSHIM_TAG_RULES, once: a bad spec is one error, and the shim runs without rules. The
 * process's first allocation comes here (the set starts unread): VMMSHIM_TAG is read first, so
 * that allocation goes to it too. */
void _vs_rules_init(void) {
  _vs_tags_init();
  const char *spec = _vs_option_string(VS_OPT_TAG_RULES);
  vs_ruleset_t *rs = NULL;
  char err[256];
  if (spec && *spec) {
    int rc = parse(spec, &rs, err, sizeof err);
    if (!rc && !rs) {
      snprintf(err, sizeof err, "no rule in '%.60s'", spec);
      rc = -EINVAL;
    }
    if (!rc) rc = publish(rs, err, sizeof err);
    if (!rc) {
      _vs_info("tag rules: %s", spec);
      return;
    }
    _vs_error("VMMSHIM_TAG_RULES: %s; running without tag rules", err);
  }
  vs_ruleset_t *expected = &vs_unread;
  atomic_compare_exchange_strong(&_vs_rules, &expected, NULL);
}

const vs_ruleset_t *_vs_rules_current(void) {
  pthread_once(&vs_rules_once, _vs_rules_init);
  return atomic_load_explicit(&_vs_rules, memory_order_acquire);
}

/* ------------------------------------------------------------------ the call site */

static bool skipped(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  for (size_t i = 0; i < sizeof vs_skip / sizeof vs_skip[0]; i++)
    if (!fnmatch(vs_skip[i], strchr(vs_skip[i], '/') ? path : base, 0)) return true;
  return false;
}

static bool lib_matches(const char *glob, const char *path) {
  const char *base = strrchr(path, '/');
  return !fnmatch(glob, strchr(glob, '/') ? path : base ? base + 1 : path, 0);
}

static const char *module_path(const void *ip) {
  Dl_info info;
  return ip && dladdr((void *)ip, &info) && info.dli_fname ? info.dli_fname : NULL;
}

typedef struct vs_site_entry_s {
  const void *ra, *code;
  const vs_ruleset_t *rs;
  uint64_t bits;
  bool walk; /* ra lies in a skipped module: the key is found by a walk */
} vs_site_entry_t;

/* Made on a thread's first site rule, freed at its exit (a pointer: the library's static TLS
 * stays small, for a process that loads it with dlopen). */
static _Thread_local vs_site_entry_t *tl_sites;
static _Thread_local int tl_in_py;
static pthread_key_t vs_sites_key;
static pthread_once_t vs_sites_once = PTHREAD_ONCE_INIT;
static void sites_key(void) { pthread_key_create(&vs_sites_key, free); }

static vs_site_entry_t *slot_of(const void *ra, const void *code, const vs_ruleset_t *rs) {
  static vs_site_entry_t none; /* no memory for a cache: every lookup misses */
  if (vs_unlikely(!tl_sites)) {
    pthread_once(&vs_sites_once, sites_key);
    tl_sites = calloc(VS_SITE_CACHE, sizeof *tl_sites);
    if (!tl_sites) return memset(&none, 0, sizeof none);
    pthread_setspecific(vs_sites_key, tl_sites);
  }
  uintptr_t h = ((uintptr_t)ra ^ ((uintptr_t)code >> 4) ^ ((uintptr_t)rs >> 6)) * 0x9E3779B97F4A7C15ull;
  return &tl_sites[h >> 56];
}

/* The matchers of the site: lib from the path of its return address's module (the caller looked
 * it up; NULL: none, or not looked up for a set with no lib: matcher), site from the stack (frames:
 * the walk, or NULL with the return address alone known), py from the code object's names. */
static uint64_t decide(const vs_ruleset_t *rs, const char *lib, void *const *frames, int nframes, const void *code) {
  char file[512] = "", func[256] = "", both[770];
  if (rs->need_py && code) _vs_pyframe_names(code, file, sizeof file, func, sizeof func);
  snprintf(both, sizeof both, "%s:%s", file, func);
  void *walked[VS_WALK_FRAMES];
  if (rs->need_walk && !frames) {
    nframes = _vs_stack_walk(walked, VS_WALK_FRAMES);
    frames = walked;
  }
  uint64_t bits = 0;
  for (int i = 0; i < rs->n; i++)
    for (int k = 0; k < rs->rules[i].n; k++) {
      const vs_matcher_t *m = &rs->rules[i].m[k];
      bool ok = false;
      if (m->kind == VS_MATCH_LIB) ok = lib && lib_matches(m->glob, lib);
      else if (m->kind == VS_MATCH_PY) ok = file[0] && (!fnmatch(m->glob, file, 0) || !fnmatch(m->glob, both, 0));
      else if (m->kind == VS_MATCH_SITE)
        for (int f = 0; f < nframes && !ok; f++) {
          Dl_info info;
          ok = dladdr((char *)frames[f] - 1, &info) && info.dli_sname && !fnmatch(m->glob, info.dli_sname, 0);
        }
      else continue;
      if (ok) bits |= 1ull << m->bit;
    }
  return bits;
}

/* The first frame of a walk outside the skipped modules, and its module's path. */
static const void *first_unskipped(void **frames, int n, int *from, const char **path) {
  for (int i = 0; i < n; i++) {
    *path = module_path((char *)frames[i] - 1);
    if (*path && !skipped(*path)) {
      *from = i;
      return frames[i];
    }
  }
  *from = n;
  *path = NULL;
  return NULL;
}

static uint64_t site_bits(const vs_ruleset_t *rs) {
  const void *ra = _vs_tl_alloc_caller, *code = NULL;
  if (rs->need_py && !tl_in_py) {
    tl_in_py = 1; /* reading frames may run the collector, whose finalizers may allocate */
    code = _vs_pyframe_code();
    tl_in_py = 0;
  }
  vs_site_entry_t *e = slot_of(ra, code, rs);
  if (vs_likely(e->ra == ra && e->code == code && e->rs == rs && ra)) {
    if (vs_likely(!e->walk)) return e->bits;
  } else if (ra) {
    const char *path = rs->need_site ? module_path((char *)ra - 1) : NULL;
    bool walk = path && skipped(path);
    *e = (vs_site_entry_t){ra, code, rs, walk ? 0 : decide(rs, path, NULL, 0, code), walk};
    if (!walk) return e->bits;
  }
  /* The allocator's return address names no site: the stack does. */
  void *frames[VS_WALK_FRAMES];
  int n = _vs_stack_walk(frames, VS_WALK_FRAMES), from;
  const char *path;
  const void *site = first_unskipped(frames, n, &from, &path);
  vs_site_entry_t *w = slot_of(site, code, rs);
  if (w->ra == site && w->code == code && w->rs == rs && site && !w->walk) return w->bits;
  uint64_t bits = decide(rs, path, frames + from, n - from, code);
  if (site) *w = (vs_site_entry_t){site, code, rs, bits, false};
  return bits;
}

/* ------------------------------------------------------------------ the allocation path */

int _vs_rules_tag(size_t size, const vs_rule_t **rule) {
  vs_ruleset_t *rs = atomic_load_explicit(&_vs_rules, memory_order_acquire);
  if (rs == &vs_unread) {
    pthread_once(&vs_rules_once, _vs_rules_init);
    rs = atomic_load_explicit(&_vs_rules, memory_order_acquire);
  }
  if (rs) {
    bool launched = atomic_load_explicit(&_vs_launched, memory_order_relaxed);
    bool capturing = atomic_load_explicit(&_vs_captures_active, memory_order_relaxed) > 0;
    uint64_t bits = 0;
    bool have_bits = false;
    for (int i = 0; i < rs->n; i++) {
      vs_rule_t *r = &rs->rules[i];
      bool ok = true;
      for (int k = 0; k < r->n && ok; k++) {
        const vs_matcher_t *m = &r->m[k];
        switch (m->kind) {
        case VS_MATCH_SIZE_GE: ok = size >= m->size; break;
        case VS_MATCH_SIZE_LT: ok = size < m->size; break;
        case VS_MATCH_BEFORE: ok = !launched; break;
        case VS_MATCH_AFTER: ok = launched; break;
        case VS_MATCH_CAPTURE: ok = capturing; break;
        default:
          if (!have_bits) bits = site_bits(rs), have_bits = true;
          ok = (bits >> m->bit) & 1;
        }
      }
      if (ok) {
        atomic_fetch_add_explicit(&r->matched, 1, memory_order_relaxed);
        *rule = r;
        return r->tag;
      }
    }
  }
  *rule = NULL;
  return atomic_load_explicit(&_vs_process_tag, memory_order_relaxed);
}
