/* config.c: every VMMSHIM_* environment variable, read once into one table.
 *
 * Hot code calls _vs_option(), which only loads a cached value. A malformed value gets
 * one message naming the variable, the value and the default used instead; a VMMSHIM_*
 * variable that is no option (a misspelling, most likely) gets one naming the nearest
 * name. Checks that need the device (granularity a multiple of the driver's minimum)
 * live in pool.c. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "vmmshim/base.h"

typedef struct vs_option_desc_s {
  uint64_t value;
  uint64_t init; /* default */
  uint64_t arg;  /* ON_LIMIT: its number */
  vs_option_t id;
  vs_option_kind_t kind;
  const char *name; /* VMMSHIM_<token> */
  const char *text; /* STRING/LOG kinds: the raw value, NULL when unset */
  bool set;         /* given in the environment and valid */
} vs_option_desc_t;

static vs_option_desc_t vs_options[VS_OPT_COUNT] = {
#define VS_OPT_DESC(tok, kind, def) {(uint64_t)(def), (uint64_t)(def), 0, VS_OPT_##tok, kind, "VMMSHIM_" #tok, NULL, false},
    VS_OPTIONS(VS_OPT_DESC)
#undef VS_OPT_DESC
};

/* VMMSHIM_LIMIT as given: every device together, and device by device. */
static uint64_t vs_limit_all, vs_limit_dev[VS_LIMIT_DEVICES];
static bool vs_limit_budget;

uint64_t _vs_option(vs_option_t opt) { return vs_options[opt].value; }
const char *_vs_option_string(vs_option_t opt) { return vs_options[opt].text; }
uint64_t _vs_option_arg(vs_option_t opt) { return vs_options[opt].arg; }
uint64_t _vs_limit_setting(int dev) { return dev < 0 ? vs_limit_all : dev < VS_LIMIT_DEVICES ? vs_limit_dev[dev] : 0; }
bool _vs_limit_in_budget(void) { return vs_limit_budget; }

static const char *skip_space(const char *s) {
  while (*s == ' ' || *s == '\t') s++;
  return s;
}

/* "64M", "2GiB", "1048576", "1.5G" is refused (whole numbers only, as a size should be). */
int _vs_parse_size(const char *text, uint64_t *out) {
  if (!text) return -1;
  const char *s = skip_space(text);
  if (*s < '0' || *s > '9') return -1; /* no sign, no empty */
  errno = 0;
  char *end;
  unsigned long long n = strtoull(s, &end, 10);
  if (errno == ERANGE) return -1;
  end = (char *)skip_space(end);
  unsigned shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  case 't': case 'T': shift = 40; end++; break;
  default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  end = (char *)skip_space(end);
  if (*end) return -1;
  if (shift && n > (UINT64_MAX >> shift)) return -1; /* overflow */
  *out = (uint64_t)n << shift;
  return 0;
}

int _vs_parse_bool(const char *text, uint64_t *out) {
  static const char *yes[] = {"1", "true", "yes", "on"};
  static const char *no[] = {"0", "false", "no", "off"};
  if (!text) return -1;
  for (size_t i = 0; i < 4; i++) {
    if (!strcasecmp(text, yes[i])) { *out = 1; return 0; }
    if (!strcasecmp(text, no[i])) { *out = 0; return 0; }
  }
  return -1;
}

static const struct {
  const char *name;
  int sig;
} vs_signal_names[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"PWR", SIGPWR}, {"WINCH", SIGWINCH}, {"URG", SIGURG}};

/* "USR2" for SIGUSR2: the name the variable takes; NULL for a signal given by number only. */
static const char *signal_name(uint64_t sig) {
  for (size_t i = 0; i < sizeof vs_signal_names / sizeof vs_signal_names[0]; i++)
    if ((uint64_t)vs_signal_names[i].sig == sig) return vs_signal_names[i].name;
  return NULL;
}

/* A signal whose default action the program relies on must keep it: the termination signals
 * (TERM, INT, QUIT, HUP, PIPE, ALRM, ...), job control (CHLD, CONT, STOP, TSTP, TTIN, TTOU),
 * KILL, the faults (SEGV, BUS, FPE, ILL, ABRT, TRAP, SYS), the resource and profiling timers
 * (XCPU, XFSZ, VTALRM, PROF) and IO. Only signals no one sends for another reason are taken:
 * USR1, USR2, PWR, WINCH, URG and the real-time signals the C library leaves to programs. */
static bool dump_signal_allowed(long n) {
  if (n == SIGUSR1 || n == SIGUSR2 || n == SIGPWR || n == SIGWINCH || n == SIGURG) return true;
  return n >= SIGRTMIN && n <= SIGRTMAX;
}

int _vs_parse_signal(const char *text, uint64_t *out) {
  if (!text) return -1;
  if (!strcasecmp(text, "off") || !strcmp(text, "0")) {
    *out = 0;
    return 0;
  }
  const char *name = strncasecmp(text, "SIG", 3) ? text : text + 3;
  for (size_t i = 0; i < sizeof vs_signal_names / sizeof vs_signal_names[0]; i++)
    if (!strcasecmp(name, vs_signal_names[i].name)) {
      *out = (uint64_t)vs_signal_names[i].sig;
      return 0;
    }
  char *end;
  errno = 0;
  long n = strtol(text, &end, 10);
  if (errno || *end || end == text || !dump_signal_allowed(n)) return -1;
  *out = (uint64_t)n;
  return 0;
}

int _vs_parse_limit(const char *text, uint64_t *all, uint64_t dev[VS_LIMIT_DEVICES]) {
  uint64_t a = 0, d[VS_LIMIT_DEVICES] = {0};
  bool seen_all = false, seen[VS_LIMIT_DEVICES] = {false};
  if (!text || !*text) return -1;
  for (const char *s = text; *s;) {
    size_t len = strcspn(s, ",");
    char item[256];
    if (len == 0 || len >= sizeof item) return -1;
    memcpy(item, s, len);
    item[len] = 0;
    if (s[len] == ',' && !s[len + 1]) return -1; /* "8G," */
    s += len + (s[len] == ',');
    char *colon = strchr(item, ':');
    uint64_t size;
    if (!colon) {
      if (seen_all || _vs_parse_size(item, &size) != 0) return -1;
      seen_all = true;
      a = size;
      continue;
    }
    *colon = 0;
    char *end;
    const char *num = skip_space(item);
    errno = 0;
    unsigned long n = strtoul(num, &end, 10);
    if (errno || end == num || *skip_space(end) || *num == '-' || *num == '+' || n >= VS_LIMIT_DEVICES || seen[n] ||
        _vs_parse_size(colon + 1, &size) != 0)
      return -1;
    seen[n] = true;
    d[n] = size;
  }
  *all = a;
  memcpy(dev, d, sizeof d);
  return 0;
}

int _vs_parse_on_limit(const char *text, uint64_t *mode, uint64_t *arg) {
  if (!text) return -1;
  const char *colon = strchr(text, ':');
  size_t len = colon ? (size_t)(colon - text) : strlen(text);
  uint64_t n = 0;
  if (len == 4 && !strncasecmp(text, "fail", 4) && !colon) {
    *mode = VS_ON_LIMIT_FAIL;
  } else if (len == 4 && !strncasecmp(text, "wait", 4)) {
    /* whole seconds, at most 1e9 (about 31 years: "wait" alone waits without end) */
    if (colon && (_vs_parse_size(colon + 1, &n) != 0 || strpbrk(colon + 1, "kKmMgGtTbB") || n < 1 || n > 1000000000))
      return -1;
    *mode = VS_ON_LIMIT_WAIT;
  } else if (len == 4 && !strncasecmp(text, "host", 4)) {
    if (colon && (_vs_parse_size(colon + 1, &n) != 0 || n == 0)) return -1;
    *mode = VS_ON_LIMIT_HOST;
  } else if (len == 7 && !strncasecmp(text, "balloon", 7)) {
    if (colon && (_vs_parse_size(colon + 1, &n) != 0 || strpbrk(colon + 1, "kKmMgGtTbB") || n < 1 || n > 3600))
      return -1;
    *mode = VS_ON_LIMIT_BALLOON;
  } else {
    return -1;
  }
  *arg = n;
  return 0;
}

bool _vs_name_ok(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > 31) return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
      return false;
  }
  return true;
}

static int parse_log_level(const char *text, uint64_t *out) {
  static const char *levels[] = {"error", "warn", "info", "debug"};
  size_t len = strcspn(text, ":");
  for (uint64_t i = 0; i < 4; i++)
    if (strlen(levels[i]) == len && !strncasecmp(text, levels[i], len)) { *out = i; return 0; }
  if (len == 1 && text[0] >= '0' && text[0] <= '3') { *out = (uint64_t)(text[0] - '0'); return 0; }
  if (len == 7 && !strncasecmp(text, "warning", 7)) { *out = VS_LOG_WARN; return 0; }
  return -1;
}

/* A size as it would be typed: 64M for 67108864, with the largest suffix that is exact. */
static const char *size_text(uint64_t v, char *buf, size_t n) {
  static const char *const suffix[] = {"", "K", "M", "G", "T"};
  unsigned k = 0;
  while (v && k < 4 && (v & 1023) == 0) {
    v >>= 10;
    k++;
  }
  snprintf(buf, n, "%llu%s", (unsigned long long)v, suffix[k]);
  return buf;
}

/* The default as the messages give it; what 0 means differs by option (the man page says). */
static const char *default_text(const vs_option_desc_t *o, char *buf, size_t n) {
  switch (o->kind) {
  case VS_KIND_BOOL: return o->init ? "1" : "0";
  case VS_KIND_SIZE_OR_UNLIMITED:
    if (o->init == UINT64_MAX) return "unlimited";
    /* fall through */
  case VS_KIND_SIZE: return size_text(o->init, buf, n);
  case VS_KIND_FREE_MODE: return "sync";
  case VS_KIND_ARENAS: snprintf(buf, n, "%llu", (unsigned long long)o->init); return buf;
  case VS_KIND_LOG: return "warn";
  case VS_KIND_TRACE_FORMAT: return "native";
  case VS_KIND_STRING: return "unset";
  case VS_KIND_RULES: return "unset";
  case VS_KIND_TAG: return "tag 'untagged'";
  case VS_KIND_SIGNAL:
    if (o->init && signal_name(o->init)) return signal_name(o->init);
    /* fall through */
  case VS_KIND_FRAMES:
    if (o->init == 0) return "0 (off)";
    snprintf(buf, n, "%llu", (unsigned long long)o->init);
    return buf;
  case VS_KIND_SAMPLE: snprintf(buf, n, "%llu", (unsigned long long)o->init); return buf;
  case VS_KIND_UNWIND: return "auto";
  case VS_KIND_PYTHON: return "on";
  case VS_KIND_PEER: return "auto";
  case VS_KIND_SECONDS: snprintf(buf, n, "%llu", (unsigned long long)o->init); return buf;
  case VS_KIND_LIMIT: return "0";
  case VS_KIND_NAME: return "unset";
  case VS_KIND_ON_LIMIT: return "fail";
  case VS_KIND_PRIORITY: snprintf(buf, n, "%llu", (unsigned long long)o->init); return buf;
  case VS_KIND_COLD_TAGS: return "unset";
  }
  return "?";
}

/* VMMSHIM_COLD_TAGS: TAG[:MODE],... (balloon.c makes the tags). */
static bool cold_tags_ok(const char *text) {
  char buf[512], *save = NULL;
  if (!*text || strlen(text) >= sizeof buf) return false;
  snprintf(buf, sizeof buf, "%s", text);
  int items = 0;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save), items++) {
    char *colon = strchr(item, ':');
    if (colon) {
      *colon++ = 0;
      if (strcmp(colon, "mapped") && strcmp(colon, "host") && strcmp(colon, "discard")) return false;
    }
    if (!_vs_name_ok(item)) return false;
  }
  return items > 0 && text[strlen(text) - 1] != ',' && text[0] != ',' && !strstr(text, ",,");
}

/* A whole number from lo to hi, no suffix. */
static int parse_count(const char *text, uint64_t lo, uint64_t hi, uint64_t *v) {
  uint64_t n;
  if (_vs_parse_size(text, &n) != 0 || n < lo || n > hi || strpbrk(text, "kKmMgGtTbB")) return -1;
  *v = n;
  return 0;
}

static int parse_one(vs_option_desc_t *o, const char *text, uint64_t *v, const char **expect) {
  o->arg = 0;
  switch (o->kind) {
  case VS_KIND_LIMIT: {
    *expect = "a size (every device together) and/or DEVICE:SIZE items (DEVICE 0 to " VS_STR(VS_LIMIT_DEVICE_LAST) "), "
              "comma-separated, as in 8G or 0:8G,1:4G";
    uint64_t dev[VS_LIMIT_DEVICES];
    if (_vs_parse_limit(text, v, dev) != 0) return -1;
    memcpy(vs_limit_dev, dev, sizeof dev);
    return 0;
  }
  case VS_KIND_NAME: *expect = "a group name: 1 to 31 of A-Z a-z 0-9 _ . -"; *v = 1; return _vs_name_ok(text) ? 0 : -1;
  case VS_KIND_ON_LIMIT:
    *expect = "fail, wait, wait:SECONDS, host, host:SIZE, balloon or balloon:SECONDS (1 to 3600)";
    return _vs_parse_on_limit(text, v, &o->arg);
  case VS_KIND_BOOL: *expect = "1/true/yes/on or 0/false/no/off"; return _vs_parse_bool(text, v);
  case VS_KIND_SIZE: *expect = "a size in bytes with an optional K/M/G/T suffix"; return _vs_parse_size(text, v);
  case VS_KIND_SIZE_OR_UNLIMITED:
    *expect = "a size in bytes with an optional K/M/G/T suffix, or 'unlimited'";
    if (!strcasecmp(text, "unlimited")) { *v = UINT64_MAX; return 0; }
    return _vs_parse_size(text, v);
  case VS_KIND_FREE_MODE:
    *expect = "sync or deferred";
    if (!strcasecmp(text, "sync")) { *v = VS_FREE_SYNC; return 0; }
    if (!strcasecmp(text, "deferred")) { *v = VS_FREE_DEFERRED; return 0; }
    return -1;
  case VS_KIND_ARENAS: *expect = "a whole number from 1 to " VS_STR(VS_MAX_ARENAS); return parse_count(text, 1, VS_MAX_ARENAS, v);
  case VS_KIND_FRAMES: *expect = "a whole number from 0 (off) to 64"; return parse_count(text, 0, 64, v);
  case VS_KIND_SAMPLE: *expect = "a whole number from 1 to 1000000000"; return parse_count(text, 1, 1000000000, v);
  case VS_KIND_SECONDS: *expect = "a whole number of seconds from 1 to 3600"; return parse_count(text, 1, 3600, v);
  case VS_KIND_PRIORITY: *expect = "a whole number from 0 to 1000"; return parse_count(text, 0, 1000, v);
  case VS_KIND_PYTHON:
    *expect = "on, held or off (1/yes/true = on, 0/no/false = off)";
    if (!strcasecmp(text, "held")) { *v = VS_PYTHON_HELD; return 0; }
    if (_vs_parse_bool(text, v) != 0) return -1;
    *v = *v ? VS_PYTHON_ON : VS_PYTHON_OFF;
    return 0;
  case VS_KIND_PEER:
    *expect = "auto, all or none";
    if (!strcasecmp(text, "auto")) { *v = VS_PEER_AUTO; return 0; }
    if (!strcasecmp(text, "all")) { *v = VS_PEER_ALL; return 0; }
    if (!strcasecmp(text, "none")) { *v = VS_PEER_NONE; return 0; }
    return -1;
  case VS_KIND_UNWIND:
    *expect = "auto, libunwind, dwarf or fp";
    if (!strcasecmp(text, "auto")) { *v = VS_UNWIND_AUTO; return 0; }
    if (!strcasecmp(text, "libunwind")) { *v = VS_UNWIND_LIBUNWIND; return 0; }
    if (!strcasecmp(text, "dwarf")) { *v = VS_UNWIND_DWARF; return 0; }
    if (!strcasecmp(text, "fp")) { *v = VS_UNWIND_FP; return 0; }
    return -1;
  case VS_KIND_LOG: *expect = "error, warn, info or debug, optionally followed by :FILE"; return parse_log_level(text, v);
  case VS_KIND_TRACE_FORMAT:
    *expect = "native or rmm";
    if (!strcasecmp(text, "native")) { *v = VS_TRACE_NATIVE; return 0; }
    if (!strcasecmp(text, "rmm")) { *v = VS_TRACE_RMM; return 0; }
    return -1;
  case VS_KIND_SIGNAL:
    *expect = "USR1, USR2, PWR, WINCH or URG (with or without SIG), their number or a real-time signal's, or "
              "0/off; termination, job-control and fault signals are refused";
    return _vs_parse_signal(text, v);
  case VS_KIND_RULES:
    *expect = "TAG=MATCHER rules separated by ';' (docs/tag-rules.md)";
    *v = 1;
    return *text ? 0 : -1;
  case VS_KIND_STRING:
    *expect = "a non-empty path";
    *v = 1;
    return *text ? 0 : -1;
  case VS_KIND_TAG: *expect = "a tag name: 1 to 31 of A-Z a-z 0-9 _ . -"; *v = 1; return _vs_name_ok(text) ? 0 : -1;
  case VS_KIND_COLD_TAGS:
    *expect = "TAG or TAG:MODE items, comma-separated (a tag name: 1 to 31 of A-Z a-z 0-9 _ . -; MODE mapped, host or "
              "discard)";
    *v = 1;
    return cold_tags_ok(text) ? 0 : -1;
  }
  return -1;
}

/* Messages found while parsing wait until the log is open (its destination is an option). */
static char vs_config_msgs[VS_OPT_COUNT][320];

/* ---- VMMSHIM_* variables that are no option: a misspelt one would otherwise be ignored
 * without a word (LIMT for LIMIT: no cap). Read once at init, from the environment itself. */

/* Read by the launcher and the tools, not by the shim: known, so no warning (man/variables.txt). */
static const char *const vs_other_vars[] = {"VMMSHIM_LIB", "VMMSHIM_AS", "VMMSHIM_PROGRESS_DELAY", "VMMSHIM_DEPS_APT",
                                            "VMMSHIM_DEPS_INCLUDE", "VMMSHIM_DEPS_LIBDIRS"};
#define VS_OTHER_VARS (sizeof vs_other_vars / sizeof vs_other_vars[0])
#define VS_UNKNOWN_MSGS 8 /* lines; more unknown variables are counted in one last line */
#define VS_NAME_CMP 64    /* characters of a name compared; no option is longer */
static char vs_unknown_msgs[VS_UNKNOWN_MSGS][200];
static unsigned vs_unknown_count;

static char upper(char c) { return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c; }

/* Edits (insert, delete, change, swap two neighbours) from a[0..na) to b[0..nb), letter case
 * ignored: LIMT and LIMTI are both one from LIMIT. */
static unsigned edit_distance(const char *a, size_t na, const char *b, size_t nb) {
  /* three rows of the table (the swap looks two back): init may run on a small thread stack */
  unsigned rows[3][VS_NAME_CMP + 1];
  if (na > VS_NAME_CMP) na = VS_NAME_CMP;
  if (nb > VS_NAME_CMP) nb = VS_NAME_CMP;
  for (size_t j = 0; j <= nb; j++) rows[0][j] = (unsigned)j;
  for (size_t i = 1; i <= na; i++) {
    unsigned *cur = rows[i % 3], *up = rows[(i - 1) % 3], *up2 = rows[(i - 2) % 3];
    cur[0] = (unsigned)i;
    for (size_t j = 1; j <= nb; j++) {
      unsigned m = up[j - 1] + (upper(a[i - 1]) != upper(b[j - 1]));
      if (up[j] + 1 < m) m = up[j] + 1;
      if (cur[j - 1] + 1 < m) m = cur[j - 1] + 1;
      if (i > 1 && j > 1 && upper(a[i - 1]) == upper(b[j - 2]) && upper(a[i - 2]) == upper(b[j - 1]) &&
          up2[j - 2] + 1 < m)
        m = up2[j - 2] + 1;
      cur[j] = m;
    }
  }
  return rows[na % 3][nb];
}

/* How far the token t (the name past VMMSHIM_) is from the known token k. A token that is one
 * of k's last parts is one edit away: STACKS is near TRACE_STACKS. */
static unsigned name_distance(const char *t, size_t nt, const char *k) {
  unsigned best = edit_distance(t, nt, k, strlen(k));
  for (const char *u = strchr(k, '_'); u; u = strchr(u + 1, '_')) {
    unsigned d = edit_distance(t, nt, u + 1, strlen(u + 1)) + 1;
    if (d < best) best = d;
  }
  return best;
}

static bool known_name(const char *name, size_t n) {
  for (int i = 0; i < VS_OPT_COUNT; i++)
    if (strlen(vs_options[i].name) == n && !memcmp(vs_options[i].name, name, n)) return true;
  for (size_t i = 0; i < VS_OTHER_VARS; i++)
    if (strlen(vs_other_vars[i]) == n && !memcmp(vs_other_vars[i], name, n)) return true;
  return false;
}

/* The known name nearest to name (VMMSHIM_ and all), or NULL when none is near enough to be
 * what was meant: at most a third of the token's letters edited, and at least one. */
static const char *nearest_name(const char *name, size_t n) {
  static const size_t pre = sizeof "VMMSHIM_" - 1;
  const char *t = name + pre, *best = NULL;
  size_t nt = n - pre;
  unsigned best_d = nt / 3 > 1 ? (unsigned)(nt / 3) : 1;
  for (int i = 0; i < VS_OPT_COUNT + (int)VS_OTHER_VARS; i++) {
    const char *k = i < VS_OPT_COUNT ? vs_options[i].name : vs_other_vars[i - VS_OPT_COUNT];
    unsigned d = name_distance(t, nt, k + pre);
    if (d <= best_d && (!best || d < best_d)) {
      best = k;
      best_d = d;
    }
  }
  return best;
}

static void unknown_read(void) {
  vs_unknown_count = 0;
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "VMMSHIM_", 8)) continue;
    size_t n = strcspn(*e, "=");
    if (known_name(*e, n)) continue;
    if (vs_unknown_count < VS_UNKNOWN_MSGS) {
      const char *near = n > 8 ? nearest_name(*e, n) : NULL;
      char *m = vs_unknown_msgs[vs_unknown_count];
      if (near)
        snprintf(m, sizeof vs_unknown_msgs[0], "%.*s is not a vmmshim variable; did you mean %s?", (int)(n > 80 ? 80 : n),
                 *e, near);
      else
        snprintf(m, sizeof vs_unknown_msgs[0], "%.*s is not a vmmshim variable (ignored; man 7 vmmshim lists them)",
                 (int)(n > 80 ? 80 : n), *e);
    }
    vs_unknown_count++;
  }
}

static void config_read(void) {
  memset(vs_limit_dev, 0, sizeof vs_limit_dev);
  for (int i = 0; i < VS_OPT_COUNT; i++) {
    vs_option_desc_t *o = &vs_options[i];
    o->value = o->init;
    o->arg = 0;
    o->text = NULL;
    o->set = false;
    vs_config_msgs[i][0] = 0;
    const char *text = getenv(o->name);
    if (!text) continue;
    uint64_t v = 0;
    const char *expect = "";
    char dbuf[32];
    if (parse_one(o, text, &v, &expect) != 0) {
      snprintf(vs_config_msgs[i], sizeof vs_config_msgs[i],
               "%s='%.80s' is not valid (expected %s); using the default %s", o->name, text, expect,
               default_text(o, dbuf, sizeof dbuf));
      continue;
    }
    o->value = v;
    o->set = true;
    if (o->kind == VS_KIND_STRING || o->kind == VS_KIND_LOG || o->kind == VS_KIND_TAG || o->kind == VS_KIND_NAME ||
        o->kind == VS_KIND_LIMIT || o->kind == VS_KIND_RULES ||
        o->kind == VS_KIND_COLD_TAGS)
      o->text = text;
  }
  /* Sizes the pool rounds up (to the device's granularity, to the handle size) or multiplies:
   * a value near 2^64 would wrap to 0 there. 1 PiB is more than any device's memory or address
   * space, and leaves every rounding far from overflow. */
  static const vs_option_t rounded[] = {VS_OPT_GRANULARITY, VS_OPT_MAX_HANDLE, VS_OPT_RESERVE};
  for (size_t k = 0; k < sizeof rounded / sizeof rounded[0]; k++) {
    vs_option_desc_t *o = &vs_options[rounded[k]];
    if (o->value <= VS_SIZE_OPTION_MAX) continue;
    char dbuf[32];
    snprintf(vs_config_msgs[rounded[k]], sizeof vs_config_msgs[0],
             "%s=%llu is larger than %llu (1 PiB, more than any device has); using the default %s", o->name,
             (unsigned long long)o->value, (unsigned long long)VS_SIZE_OPTION_MAX, default_text(o, dbuf, sizeof dbuf));
    o->value = o->init;
    o->set = false;
  }
  /* VMMSHIM_LIMIT's caps belong to the budget (src/handle/group.c) when they are shared, per
   * device, or waited for; else it is this process's own cap, as it always was. */
  vs_option_desc_t *lim = &vs_options[VS_OPT_LIMIT];
  vs_limit_all = lim->value;
  bool per_device = false;
  for (int d = 0; d < VS_LIMIT_DEVICES; d++) per_device |= vs_limit_dev[d] != 0;
  vs_limit_budget = vs_options[VS_OPT_LIMIT_GROUP].set || per_device ||
                    vs_options[VS_OPT_ON_LIMIT].value == VS_ON_LIMIT_WAIT;
  if (vs_limit_budget) lim->value = 0;
  if (vs_options[VS_OPT_GRANULARITY].value == 0) {
    char dbuf[32];
    snprintf(vs_config_msgs[VS_OPT_GRANULARITY], sizeof vs_config_msgs[0],
             "VMMSHIM_GRANULARITY=0 is not valid (a pool cannot grow by 0 bytes); using the default %s",
             default_text(&vs_options[VS_OPT_GRANULARITY], dbuf, sizeof dbuf));
    vs_options[VS_OPT_GRANULARITY].value = vs_options[VS_OPT_GRANULARITY].init;
  }
  unknown_read();
}

static void config_report(void) {
  for (int i = 0; i < VS_OPT_COUNT; i++)
    if (vs_config_msgs[i][0]) _vs_warn("%s", vs_config_msgs[i]);
  for (unsigned i = 0; i < vs_unknown_count && i < VS_UNKNOWN_MSGS; i++) _vs_warn("%s", vs_unknown_msgs[i]);
  if (vs_unknown_count > VS_UNKNOWN_MSGS)
    _vs_warn("%u more VMMSHIM_ variables that vmmshim does not know", vs_unknown_count - VS_UNKNOWN_MSGS);
}

static pthread_once_t vs_config_once = PTHREAD_ONCE_INIT;
static void config_once(void) { config_read(); }

void _vs_config_init(void) { pthread_once(&vs_config_once, config_once); }

void _vs_config_reload(void) { config_read(); }

void _vs_config_report(void) { config_report(); }

void _vs_config_print(void) {
  _vs_note("version %s", VMMSHIM_VERSION);
  for (int i = 0; i < VS_OPT_COUNT; i++) {
    const vs_option_desc_t *o = &vs_options[i];
    char buf[64];
    const char *shown;
    switch (o->kind) {
    case VS_KIND_BOOL: shown = o->value ? "1" : "0"; break;
    case VS_KIND_FREE_MODE: shown = o->value == VS_FREE_DEFERRED ? "deferred" : "sync"; break;
    case VS_KIND_TRACE_FORMAT: shown = o->value == VS_TRACE_RMM ? "rmm" : "native"; break;
    case VS_KIND_LOG: {
      static const char *names[] = {"error", "warn", "info", "debug"};
      shown = names[o->value & 3];
      break;
    }
    case VS_KIND_STRING:
    case VS_KIND_RULES:
    case VS_KIND_COLD_TAGS:
    case VS_KIND_NAME: shown = o->text ? o->text : "(unset)"; break;
    case VS_KIND_TAG: shown = o->text ? o->text : "tag 'untagged'"; break;
    case VS_KIND_LIMIT:
      if (!o->text) shown = "0 (off)";
      else {
        snprintf(buf, sizeof buf, "%.40s%s", o->text, vs_limit_budget ? " (the budget's)" : "");
        shown = buf;
      }
      break;
    case VS_KIND_ON_LIMIT: {
      static const char *names[] = {"fail", "wait", "host", "balloon"};
      if (o->arg) snprintf(buf, sizeof buf, "%s:%llu", names[o->value & 3], (unsigned long long)o->arg);
      else snprintf(buf, sizeof buf, "%s", names[o->value & 3]);
      shown = buf;
      break;
    }
    case VS_KIND_PYTHON: {
      static const char *names[] = {"off", "held", "on", "?"};
      shown = names[o->value & 3];
      break;
    }
    case VS_KIND_PEER: {
      static const char *names[] = {"auto", "all", "none", "?"};
      shown = names[o->value & 3];
      break;
    }
    case VS_KIND_UNWIND: {
      static const char *names[] = {"auto", "libunwind", "dwarf", "fp"};
      shown = names[o->value & 3];
      break;
    }
    case VS_KIND_SIGNAL:
      if (!o->value) shown = "0 (off)";
      else if (signal_name(o->value)) {
        snprintf(buf, sizeof buf, "%s (%llu)", signal_name(o->value), (unsigned long long)o->value);
        shown = buf;
      } else {
        snprintf(buf, sizeof buf, "%llu (%s)", (unsigned long long)o->value, strsignal((int)o->value));
        shown = buf;
      }
      break;
    default:
      if (o->kind == VS_KIND_SIZE_OR_UNLIMITED && o->value == UINT64_MAX) shown = "unlimited";
      else { snprintf(buf, sizeof buf, "%llu", (unsigned long long)o->value); shown = buf; }
    }
    _vs_note("option %s = %s%s", o->name, shown, o->set ? "" : " (default)");
  }
}

int _vs_option_describe(int i, const char **name, const char **accepted, char *buf, size_t n) {
  if (i < 0 || i >= VS_OPT_COUNT) return -1;
  vs_option_desc_t o = vs_options[i];
  uint64_t v;
  *name = o.name;
  *accepted = "";
  parse_one(&o, "", &v, accepted); /* every kind says what it expects before it parses */
  const char *d = default_text(&o, buf, n);
  if (d != buf) snprintf(buf, n, "%s", d);
  return 0;
}
