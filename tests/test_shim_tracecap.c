/* test_shim_tracecap: VMMSHIM_TRACE_MAX, the cap on the trace file, under the shim, one
 * process per scenario (the shim reads its options once). The child makes cudaMalloc/cudaFree
 * pairs (one thread, or four at once) and checks that every one was served by the shim, cap or
 * no cap; the parent reads the file it left:
 *   - 64K cap, 4000 pairs (about 350 KiB of trace without a cap): the file is at most 64 KiB and
 *     close to it, every line whole, the last line the end record with the cap as its second
 *     field ("e T 10000") and no other end record, one warning naming the variable, and
 *     vmmshim-report reads the file with no warning;
 *   - the same from four threads at once;
 *   - stacks on (module, stack lines of up to 4 KiB) and an 8K cap: within the cap, every
 *     allocation's stack written before it;
 *   - a cap smaller than the header: the header, the end record, nothing else;
 *   - the rmm format: within the cap, whole lines, no marker (the CSV has no place for one);
 *   - a cap the trace stays under, and no cap: the usual end record, no warning;
 *   - VMMSHIM_STATS=1: the shim says the file's size at exit (the size the file has), and
 *     that it was cut. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define PAIRS 4000
#define THREADS 4

static char g_dir[256];

/* ---------------------------------------------------------------- the children */

static void *pairs(void *arg) {
  int n = (int)(intptr_t)arg, bad = 0;
  for (int i = 0; i < n; i++) {
    void *p = NULL;
    if (cudaMalloc(&p, 4096 + (size_t)(i % 7) * 512) != cudaSuccess || !p || cudaFree(p) != cudaSuccess) bad++;
  }
  return (void *)(intptr_t)bad;
}

static void child_pairs(void) {
  CHECK(pairs((void *)(intptr_t)PAIRS) == NULL, "a cudaMalloc/cudaFree pair failed");
  vmmshim_stats_t s = shim_stats();
  CHECK(s.allocs[VMMSHIM_API_RUNTIME] == PAIRS && s.frees[VMMSHIM_API_RUNTIME] == PAIRS,
        "the shim served %llu allocations and %llu frees of %d", (unsigned long long)s.allocs[VMMSHIM_API_RUNTIME],
        (unsigned long long)s.frees[VMMSHIM_API_RUNTIME], PAIRS);
}

static void child_threads(void) {
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, pairs, (void *)(intptr_t)(PAIRS / THREADS));
  for (int i = 0; i < THREADS; i++) {
    void *bad = NULL;
    pthread_join(t[i], &bad);
    CHECK(bad == NULL, "thread %d: %ld pairs failed", i, (long)(intptr_t)bad);
  }
  vmmshim_stats_t s = shim_stats();
  CHECK(s.allocs[VMMSHIM_API_RUNTIME] == PAIRS, "the shim served %llu allocations of %d",
        (unsigned long long)s.allocs[VMMSHIM_API_RUNTIME], PAIRS);
}

/* ---------------------------------------------------------------- the parent's checks */

typedef struct {
  char *text;
  size_t size;
  int lines, ends, allocs, frees, whole; /* whole: the file ends with a newline (or is empty) */
  int stacks_missing;                    /* allocations whose stack was not written before them */
  char last[256];                        /* the last line */
} trace_t;

static int read_trace(trace_t *t, const char *path) {
  memset(t, 0, sizeof *t);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  struct stat st;
  fstat(fileno(f), &st);
  t->size = (size_t)st.st_size;
  t->text = calloc(1, t->size + 1);
  size_t got = fread(t->text, 1, t->size, f);
  fclose(f);
  t->text[got] = 0;
  t->whole = got == 0 || t->text[got - 1] == '\n';
  static char seen[1 << 16];
  memset(seen, 0, sizeof seen);
  for (char *line = t->text; *line;) {
    char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    t->lines++;
    snprintf(t->last, sizeof t->last, "%.*s", (int)len, line);
    unsigned long long id = 0;
    if (line[0] == 'e' && line[1] == ' ') t->ends++;
    if (line[0] == 'f' && line[1] == ' ') t->frees++;
    if (line[0] == 'k' && sscanf(line, "k %llx", &id) == 1 && id < sizeof seen) seen[id] = 1;
    if (line[0] == 'a' && line[1] == ' ') {
      t->allocs++;
      /* the stack id is the last field */
      const char *sp = line + len;
      while (sp > line && sp[-1] != ' ') sp--;
      id = strtoull(sp, NULL, 16);
      if (id && (id >= sizeof seen || !seen[id])) t->stacks_missing++;
    }
    line = nl ? nl + 1 : line + len;
  }
  return 0;
}

/* vmmshim-report on the file: its exit status, and what it printed on standard error. */
static int report(const char *trace, char *err, size_t cap) {
  const char *tool = "scripts/vmmshim-report";
  if (access(tool, R_OK) != 0) {
    snprintf(err, cap, "%s not found (run from the repository root)", tool);
    return -1;
  }
  char cmd[1024];
  /* Without the runner's preloads: the tool is Python, not the program under test. */
  snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD -u LD_LIBRARY_PATH ${PYTHON:-python3} %s %s 2>&1 >/dev/null", tool,
           trace);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(err, 1, cap - 1, p);
  err[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *path_of(const char *name) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  return path;
}

#define WARNING "reached VMMSHIM_TRACE_MAX"

/* A cut native trace: within the cap and close to it, whole lines, the marker last. */
static void check_cut(const char *label, const char *name, unsigned long long cap, unsigned long long slack) {
  trace_t t;
  const char *path = path_of(name);
  if (read_trace(&t, path) != 0) {
    CHECK(0, "%s: no trace at %s", label, path);
    return;
  }
  char want[64];
  CHECK(t.size <= cap && t.size + slack > cap, "%s: %zu bytes for a cap of %llu", label, t.size, cap);
  CHECK(t.whole, "%s: the file ends with a whole line", label);
  snprintf(want, sizeof want, " %llx", cap);
  size_t wl = strlen(want), ll = strlen(t.last);
  CHECK(t.last[0] == 'e' && ll > wl && !strcmp(t.last + ll - wl, want) && check_count(t.last, " ") == 2,
        "%s: the last line is the end record with the cap: '%s'", label, t.last);
  CHECK(t.ends == 1, "%s: %d end records", label, t.ends);
  CHECK(t.allocs + t.frees < 2 * PAIRS, "%s: %d of %d events kept", label, t.allocs + t.frees, 2 * PAIRS);
  CHECK(t.stacks_missing == 0, "%s: %d allocations refer to a stack not written before them", label, t.stacks_missing);
  char want_warn[700];
  snprintf(want_warn, sizeof want_warn,
           "vmmshim: warning: trace %s reached VMMSHIM_TRACE_MAX (%llu bytes); later events are not recorded", path, cap);
  CHECK(check_count(check_child_output, want_warn) == 1 && check_count(check_child_output, WARNING) == 1,
        "%s: one warning '%s' (%d)", label, want_warn, check_count(check_child_output, WARNING));
  char err[4096];
  int rc = report(path, err, sizeof err);
  CHECK(rc == 0 && !err[0], "%s: vmmshim-report reads the cut trace: exit %d, '%s'", label, rc, err);
  free(t.text);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *sc = check_child_main(argc, argv);
  if (sc) {
    alarm(120);
    if (!strcmp(sc, "pairs")) child_pairs();
    else if (!strcmp(sc, "threads")) child_threads();
    else CHECK(0, "unknown scenario %s", sc);
    return check_child_summary(sc);
  }
  snprintf(g_dir, sizeof g_dir, "/tmp/vmmshim-tracecap-test-XXXXXX");
  if (!mkdtemp(g_dir)) return 1;
  char env[600];
  trace_t t;

  /* No cap: the workload makes a trace well past the caps below. */
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path_of("nocap.trace"));
  check_run_child("pairs", env, NULL);
  CHECK(read_trace(&t, path_of("nocap.trace")) == 0 && t.size > 4 * 65536 && t.allocs == PAIRS && t.ends == 1 &&
            t.last[0] == 'e' && check_count(t.last, " ") == 1,
        "no cap: %zu bytes, %d allocations, %d end records, last line '%s'", t.size, t.allocs, t.ends, t.last);
  CHECK(!strstr(check_child_output, WARNING), "no cap: no warning");
  free(t.text);

  /* 64K, one thread, with the size said at exit. */
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path_of("cap.trace"));
  check_run_child("pairs", env, "VMMSHIM_TRACE_MAX=64K", "VMMSHIM_STATS=1", NULL);
  check_cut("64K", "cap.trace", 65536, 256);
  if (read_trace(&t, path_of("cap.trace")) == 0) {
    char want[700];
    snprintf(want, sizeof want, "vmmshim: stats: trace %s: %zu bytes, cut at VMMSHIM_TRACE_MAX", path_of("cap.trace"),
             t.size);
    CHECK(strstr(check_child_output, want) != NULL, "64K: at exit '%s'", want);
    free(t.text);
  }

  /* 64K, four threads draining in turn. */
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path_of("threads.trace"));
  check_run_child("threads", env, "VMMSHIM_TRACE_MAX=64K", NULL);
  check_cut("64K, 4 threads", "threads.trace", 65536, 256);

  /* Stacks: module lines can be long; 8K. */
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path_of("stacks.trace"));
  check_run_child("pairs", env, "VMMSHIM_TRACE_MAX=8K", "VMMSHIM_TRACE_STACKS=16", NULL);
  check_cut("8K, stacks", "stacks.trace", 8192, 4400);

  /* Smaller than the header: the header and the end record. */
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path_of("tiny.trace"));
  check_run_child("pairs", env, "VMMSHIM_TRACE_MAX=100", NULL);
  if (read_trace(&t, path_of("tiny.trace")) == 0) {
    CHECK(t.allocs == 0 && t.frees == 0 && t.ends == 1 && !strncmp(t.text, "v 4 ", 4) && t.whole &&
              t.last[0] == 'e' && strlen(t.last) > 3 && !strcmp(t.last + strlen(t.last) - 3, " 64"),
          "cap 100: header and end record only: %d allocations, last line '%s'", t.allocs, t.last);
    CHECK(check_count(check_child_output, WARNING) == 1, "cap 100: one warning");
    free(t.text);
  } else {
    CHECK(0, "cap 100: no trace");
  }

  /* rmm: no marker. */
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path_of("rmm.trace"));
  check_run_child("pairs", env, "VMMSHIM_TRACE_MAX=16K", "VMMSHIM_TRACE_FORMAT=rmm", NULL);
  if (read_trace(&t, path_of("rmm.trace")) == 0) {
    CHECK(t.size <= 16384 && t.size + 256 > 16384 && t.whole && check_count(t.last, ",") == 5 && t.last[0] != 'e',
          "rmm, 16K: %zu bytes, whole lines, the last one an event: '%s'", t.size, t.last);
    CHECK(check_count(check_child_output, WARNING) == 1, "rmm, 16K: one warning");
    char err[4096];
    int rc = report(path_of("rmm.trace"), err, sizeof err);
    CHECK(rc == 0 && !err[0], "rmm, 16K: vmmshim-report reads it: exit %d, '%s'", rc, err);
    free(t.text);
  } else {
    CHECK(0, "rmm: no trace");
  }

  /* A cap the trace stays under. */
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path_of("under.trace"));
  check_run_child("pairs", env, "VMMSHIM_TRACE_MAX=10M", "VMMSHIM_STATS=1", NULL);
  if (read_trace(&t, path_of("under.trace")) == 0) {
    CHECK(t.allocs == PAIRS && t.frees == PAIRS && t.ends == 1 && check_count(t.last, " ") == 1,
          "10M: every event, the usual end record: %d allocations, last line '%s'", t.allocs, t.last);
    CHECK(!strstr(check_child_output, WARNING), "10M: no warning");
    char want[700];
    snprintf(want, sizeof want, "vmmshim: stats: trace %s: %zu bytes\n", path_of("under.trace"), t.size);
    CHECK(strstr(check_child_output, want) != NULL, "10M: at exit '%.*s'", (int)strlen(want) - 1, want);
    free(t.text);
  } else {
    CHECK(0, "10M: no trace");
  }

  if (!check_failed) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) printf("could not remove %s\n", g_dir);
  } else {
    printf("traces kept in %s\n", g_dir);
  }
  return check_summary();
}
