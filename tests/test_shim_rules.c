/* test_shim_rules: tags without code (VMMSHIM_TAG_RULES, docs/tag-rules.md), under the shim, one
 * process per scenario (the rules are read once per process):
 *   - lib: the allocations of two shared objects (librules_a.so, librules_b.so, built for this
 *     test) go to their tags, the program's own to the process's tag, also through a stand-in
 *     for an allocator library (librmm.so), which lib: looks past to its caller;
 *   - site: a C symbol anywhere in the stack; size:>= and size:<; phase (a launch through the
 *     emulated cuLaunchKernel, or the emulated runtime's cudaLaunchKernel, ends before-launch);
 *     capture (cuStreamBeginCapture);
 *   - the first matching rule wins; all: needs every matcher; a thread's own tag wins over rules;
 *     the process's first allocation goes to VMMSHIM_TAG's tag (read before it);
 *   - rules changed at run time through vmmshim_set_tag_rules and through the control channel
 *     (rules verb, and status), with counts of what each rule tagged;
 *   - malformed rules: each message names the rule and the character; from the environment the
 *     shim runs without rules, through the API and ctl the rules in force stay;
 *   - the trace: a 'j' record (rule, tag, text) before the 'a' of each rule-tagged allocation;
 *   - rules replaced 400 times while four threads allocate and free (also under TSan). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

#pragma weak vmmshim_set_tag
#pragma weak vmmshim_tag_stats
#pragma weak vmmshim_set_tag_rules

void *rules_lib_a_alloc(size_t n); /* librules_a.so */
void *rules_lib_b_alloc(size_t n); /* librules_b.so */
void *rules_lib_a_via(size_t n);   /* librules_a.so, through librmm.so */
void *rules_lib_b_via(size_t n);   /* librules_b.so, through librmm.so */
void *rules_pool_alloc(size_t n);  /* librmm.so, called from here */

/* ---------------------------------------------------------------- tags of allocations */

/* The tag whose live bytes an allocation made by fn grew ("?" when none or several did). */
static const char *tag_of_alloc(void *(*fn)(size_t), size_t n, void **out) {
  static char name[sizeof ((vmmshim_tag_stats_t *)0)->name];
  vmmshim_tag_stats_t before[VMMSHIM_MAX_TAGS], after[VMMSHIM_MAX_TAGS];
  int nb = vmmshim_tag_stats(before, VMMSHIM_MAX_TAGS, sizeof before[0]);
  void *p = fn(n);
  if (out) *out = p;
  CHECK(p != NULL, "allocation of %zu bytes", n);
  int na = vmmshim_tag_stats(after, VMMSHIM_MAX_TAGS, sizeof after[0]);
  int grown = 0;
  snprintf(name, sizeof name, "?");
  for (int i = 0; i < na && i < VMMSHIM_MAX_TAGS; i++) {
    uint64_t was = 0;
    for (int k = 0; k < nb && k < VMMSHIM_MAX_TAGS; k++)
      if (!strcmp(before[k].name, after[i].name)) was = before[k].live;
    if (after[i].live > was) {
      grown++;
      memcpy(name, after[i].name, sizeof name);
      name[sizeof name - 1] = 0;
    }
  }
  if (grown != 1) snprintf(name, sizeof name, "?");
  return name;
}

#define EXPECT_TAG(fn, n, want)                                                   \
  do {                                                                            \
    const char *got_ = tag_of_alloc(fn, n, NULL);                                 \
    CHECK(!strcmp(got_, want), "%s(%llu): tag '%s', expected '%s'", #fn,           \
          (unsigned long long)(n), got_, want);                                   \
  } while (0)

__attribute__((noinline)) static void *main_alloc(size_t n) {
  void *p = NULL;
  void *out = cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
  __asm__ volatile("" ::: "memory");
  return out;
}

/* site: the outer function is in the stack, not the one that calls cudaMalloc. */
__attribute__((noinline)) void *rules_site_inner(size_t n) {
  void *p = NULL;
  void *out = cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
  __asm__ volatile("" ::: "memory");
  return out;
}
__attribute__((noinline)) void *rules_outer_loader(size_t n) {
  void *p = rules_site_inner(n);
  __asm__ volatile("" ::: "memory");
  return p;
}

/* ---------------------------------------------------------------- scenarios */

static void child_lib(void) {
  EXPECT_TAG(rules_lib_a_alloc, MiB, "a");
  EXPECT_TAG(rules_lib_b_alloc, MiB, "b");
  EXPECT_TAG(main_alloc, MiB, "untagged");
  EXPECT_TAG(rules_lib_a_alloc, 3 * MiB, "a"); /* the same site again: from the cache */
  EXPECT_TAG(rules_lib_b_alloc, 3 * MiB, "b");
  /* Through an allocator library (librmm.so): its one return address serves both libraries, each
   * allocation is its caller's, in turns. */
  for (int i = 0; i < 2; i++) {
    EXPECT_TAG(rules_lib_a_via, MiB, "a");
    EXPECT_TAG(rules_lib_b_via, MiB, "b");
    EXPECT_TAG(rules_pool_alloc, MiB, "untagged"); /* its caller is the program */
  }
}

static void child_site(void) {
  EXPECT_TAG(rules_outer_loader, MiB, "loader");
  EXPECT_TAG(main_alloc, MiB, "untagged");
  EXPECT_TAG(rules_outer_loader, 2 * MiB, "loader");
}

static void child_size(void) {
  EXPECT_TAG(main_alloc, 2 * MiB, "big");
  EXPECT_TAG(main_alloc, 1 * KiB, "small");
  EXPECT_TAG(main_alloc, 64 * KiB, "untagged");
  EXPECT_TAG(main_alloc, 1 * MiB, "big"); /* >= includes the bound */
  EXPECT_TAG(main_alloc, 4 * KiB, "untagged"); /* < excludes it */
}

static void child_phase(void) {
  EXPECT_TAG(main_alloc, MiB, "load");
  EXPECT_TAG(main_alloc, MiB, "load");
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  CHECK(cuLaunchKernel((CUfunction)(uintptr_t)0x1000, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL) == CUDA_SUCCESS, "launch");
  cuStreamSynchronize(s);
  EXPECT_TAG(main_alloc, MiB, "run");
  EXPECT_TAG(main_alloc, MiB, "run");
}

/* The runtime's launch reaches the driver through the entry points cuGetProcAddress gave it: the
 * shim's launch hooks see it too. */
static void child_phase_rt(void) {
  EXPECT_TAG(main_alloc, MiB, "load");
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
  void *args[1] = {NULL};
  CHECK(cudaLaunchKernel((const void *)child_phase_rt, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, s) == cudaSuccess,
        "cudaLaunchKernel");
  cudaStreamSynchronize(s);
  EXPECT_TAG(main_alloc, MiB, "run");
}

static void child_capture(void) {
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  EXPECT_TAG(main_alloc, MiB, "untagged");
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS, "begin capture");
  EXPECT_TAG(main_alloc, MiB, "graphs");
  CUgraph g = NULL;
  CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS, "end capture");
  if (g) cuGraphDestroy(g);
  EXPECT_TAG(main_alloc, MiB, "untagged");
}

static void child_order(void) {
  EXPECT_TAG(main_alloc, 2 * MiB, "first"); /* both match: the first rule wins */
  EXPECT_TAG(main_alloc, 2 * KiB, "first");
  EXPECT_TAG(rules_lib_a_alloc, 2 * MiB, "both"); /* all: every matcher */
  EXPECT_TAG(rules_lib_a_alloc, 512, "a");        /* size fails: the next rule */
}

static void child_explicit(void) {
  CHECK(vmmshim_set_tag("mine") == 0, "set_tag");
  EXPECT_TAG(main_alloc, 2 * MiB, "mine"); /* the thread's own tag wins */
  CHECK(vmmshim_set_tag(NULL) == 0, "set_tag NULL");
  EXPECT_TAG(main_alloc, 2 * MiB, "big");
  EXPECT_TAG(main_alloc, 2 * KiB, "proc"); /* no rule: the process's tag (VMMSHIM_TAG) */
}

/* The process's very first allocation, with no rules: VMMSHIM_TAG's tag, whether the program
 * asked for its tags before (first-api) or not (first). */
static void child_first(int api_first) {
  if (api_first) {
    EXPECT_TAG(main_alloc, 2 * MiB, "proc");
  } else {
    CHECK(main_alloc(2 * MiB) != NULL, "the first allocation");
    vmmshim_tag_stats_t all[VMMSHIM_MAX_TAGS];
    int n = vmmshim_tag_stats(all, VMMSHIM_MAX_TAGS, sizeof all[0]);
    uint64_t proc = 0, untagged = 0;
    for (int i = 0; i < n && i < VMMSHIM_MAX_TAGS; i++) {
      if (!strcmp(all[i].name, "proc")) proc = all[i].live;
      if (!strcmp(all[i].name, "untagged")) untagged = all[i].live;
    }
    CHECK(proc >= 2 * MiB && untagged == 0, "the first allocation: proc %llu, untagged %llu bytes",
          (unsigned long long)proc, (unsigned long long)untagged);
  }
  EXPECT_TAG(main_alloc, 2 * MiB, "proc");
}

static void child_api(void) {
  char err[256];
  EXPECT_TAG(main_alloc, 2 * MiB, "untagged");
  CHECK(vmmshim_set_tag_rules("x=size:>=1M", err, sizeof err) == 0, "set rules: %s", err);
  EXPECT_TAG(main_alloc, 2 * MiB, "x");
  int rc = vmmshim_set_tag_rules("y=size:>=1M;z=sz:1", err, sizeof err);
  CHECK(rc == -EINVAL, "a bad spec: %d", rc);
  CHECK(strstr(err, "rule 2 ('z=sz:1'), at character 15: unknown matcher") != NULL, "message: %s", err);
  EXPECT_TAG(main_alloc, 2 * MiB, "x"); /* the rules in force stay */
  CHECK(vmmshim_set_tag_rules(NULL, err, sizeof err) == 0, "clear");
  EXPECT_TAG(main_alloc, 2 * MiB, "untagged");
  CHECK(vmmshim_set_tag_rules("y=size:>=1M", NULL, 0) == 0, "set rules without err");
  EXPECT_TAG(main_alloc, 2 * MiB, "y");
  CHECK(vmmshim_set_tag_rules(" ; ;", err, sizeof err) == 0, "a spec without a rule clears: %s", err);
  EXPECT_TAG(main_alloc, 2 * MiB, "untagged");
}

/* Each malformed spec and the message it must get. */
static void child_malformed(void) {
  static const struct { const char *spec, *msg; } bad[] = {
      {"noequals", "rule 1 ('noequals'), at character 9: no '=': a rule is TAG=MATCHER"},
      {"=size:>=1", "rule 1 ('=size:>=1'), at character 1: the tag is 1-31 of"},
      {"bad!=capture", "rule 1 ('bad!=capture'), at character 1: the tag is 1-31 of"},
      {"a=size:>1M", "rule 1 ('a=size:>1M'), at character 3: size: takes >=N or <N"},
      {"a=size:>=lots", "rule 1 ('a=size:>=lots'), at character 3: size: needs a number"},
      {"a=phase:later", "rule 1 ('a=phase:later'), at character 3: a phase is before-launch or after-launch"},
      {"a=lib:", "rule 1 ('a=lib:'), at character 3: the glob is empty"},
      {"a=capture,size:<1", "rule 1 ('a=capture,size:<1'), at character 10: ',' joins matchers only inside all:"},
      {"a=all:capture,,size:<1", "rule 1 ('a=all:capture,,size:<1'), at character 15: a matcher is missing"},
      {"ok=capture; b=frob", "rule 2 ('b=frob'), at character 15: unknown matcher"},
      {"a=all:", "rule 1 ('a=all:'), at character 7: a matcher is missing"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    int rc = vmmshim_set_tag_rules(bad[i].spec, err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, bad[i].msg), "'%s': %d '%s', expected '%s'", bad[i].spec, rc, err, bad[i].msg);
  }
  CHECK(vmmshim_set_tag_rules(" a=capture ; ; b=size:<1K;", err, sizeof err) == 0, "spaces and empty rules: %s", err);
}

static void child_badenv(void) {
  EXPECT_TAG(main_alloc, 2 * MiB, "untagged"); /* the shim runs without rules */
  char err[256];
  CHECK(vmmshim_set_tag_rules("x=size:>=1M", err, sizeof err) == 0, "rules set later still work");
  EXPECT_TAG(main_alloc, 2 * MiB, "x");
}

/* Rules replaced while threads allocate: each thread's allocations go to one of the tags the
 * sets name (a set is seen whole), every free succeeds, nothing is lost. */
#define SWAP_THREADS 4
#define SWAP_ALLOCS 3000

static void *swap_worker(void *arg) {
  int *bad = arg;
  for (int i = 0; i < SWAP_ALLOCS; i++) {
    void *p = NULL;
    if (cudaMalloc(&p, 4096 + (size_t)(i % 7) * 512) != cudaSuccess || !p || cudaFree(p) != cudaSuccess) (*bad)++;
  }
  return NULL;
}

static void child_swap(void) {
  pthread_t t[SWAP_THREADS];
  int bad[SWAP_THREADS] = {0};
  for (int i = 0; i < SWAP_THREADS; i++) pthread_create(&t[i], NULL, swap_worker, &bad[i]);
  static const char *const sets[] = {"x=size:>=1", "y=size:<5K;x=size:>=1", "", "x=all:size:>=1,phase:before-launch"};
  for (int i = 0; i < 400; i++) CHECK(vmmshim_set_tag_rules(sets[i % 4], NULL, 0) == 0, "swap %d", i);
  for (int i = 0; i < SWAP_THREADS; i++) {
    pthread_join(t[i], NULL);
    CHECK(bad[i] == 0, "thread %d: %d allocations or frees failed", i, bad[i]);
  }
  vmmshim_tag_stats_t all[VMMSHIM_MAX_TAGS];
  int n = vmmshim_tag_stats(all, VMMSHIM_MAX_TAGS, sizeof all[0]);
  uint64_t live = 0;
  for (int i = 0; i < n && i < VMMSHIM_MAX_TAGS; i++) {
    CHECK(!strcmp(all[i].name, "untagged") || !strcmp(all[i].name, "x") || !strcmp(all[i].name, "y"), "tag %s",
          all[i].name);
    if (strcmp(all[i].name, "untagged")) live += all[i].live;
  }
  CHECK(live == 0, "everything freed: %llu bytes live in x and y", (unsigned long long)live);
}

/* ---------------------------------------------------------------- the control channel */

static char g_reply[1 << 16];

static const char *ctl(const char *req) {
  g_reply[0] = 0;
  int fd = ctl_connect(getpid(), geteuid());
  if (fd < 0) return g_reply;
  char line[1024];
  int n = snprintf(line, sizeof line, "%s\n", req);
  if (send(fd, line, (size_t)n, MSG_NOSIGNAL) == n) {
    size_t got = 0;
    while (got + 1 < sizeof g_reply && recv(fd, g_reply + got, 1, 0) == 1 && g_reply[got] != '\n') got++;
    g_reply[got] = 0;
  }
  close(fd);
  return g_reply;
}

static void child_ctl(void) {
  EXPECT_TAG(main_alloc, 2 * MiB, "x");
  EXPECT_TAG(main_alloc, 3 * MiB, "x");
  const char *r = ctl("{\"v\":1,\"cmd\":\"rules\"}");
  CHECK(strstr(r, "\"ok\":true") && strstr(r, "\"rules\":[{\"rule\":\"x=size:>=1M\",\"tag\":\"x\",\"matched\":2}]"),
        "rules: %s", r);
  r = ctl("{\"v\":1,\"cmd\":\"rules\",\"spec\":\"y=size:>=1M\"}");
  CHECK(strstr(r, "\"ok\":true") && strstr(r, "\"changed\":true") && strstr(r, "\"rule\":\"y=size:>=1M\""), "set: %s", r);
  EXPECT_TAG(main_alloc, 2 * MiB, "y");
  r = ctl("{\"v\":1,\"cmd\":\"rules\",\"spec\":\"z=size:=1\"}");
  CHECK(strstr(r, "\"ok\":false") && strstr(r, "rule 1 ('z=size:=1'), at character 3: size: takes >=N or <N"), "bad: %s",
        r);
  EXPECT_TAG(main_alloc, 2 * MiB, "y"); /* unchanged */
  r = ctl("{\"v\":1,\"cmd\":\"status\"}");
  const char *rules = strstr(r, "\"rules\":");
  CHECK(rules && !strcmp(rules, "\"rules\":[{\"rule\":\"y=size:>=1M\",\"tag\":\"y\",\"matched\":2}]}"), "status: %s",
        rules ? rules : r);
  r = ctl("{\"v\":1,\"cmd\":\"rules\",\"clear\":true}");
  CHECK(strstr(r, "\"ok\":true") && strstr(r, "\"rules\":[]"), "clear: %s", r);
  EXPECT_TAG(main_alloc, 2 * MiB, "untagged");
  r = ctl("{\"v\":1,\"cmd\":\"rules\",\"clear\":true,\"spec\":\"a=capture\"}");
  CHECK(strstr(r, "\"ok\":false") && strstr(r, "not both"), "both: %s", r);
}

/* ---------------------------------------------------------------- the trace */

static void child_trace(void) {
  void *p = NULL;
  tag_of_alloc(main_alloc, 2 * MiB, &p);
  printf("PTR %llx\n", (unsigned long long)(uintptr_t)p);
  tag_of_alloc(main_alloc, 2 * KiB, NULL);
}

static void check_trace(const char *path, const char *out) {
  const char *at = strstr(out, "PTR ");
  unsigned long long ptr = at ? strtoull(at + 4, NULL, 16) : 0;
  FILE *f = fopen(path, "r");
  CHECK(f != NULL, "trace %s", path);
  if (!f) return;
  char line[512], want_j[128], want_a[64], last[512] = "";
  snprintf(want_j, sizeof want_j, "%llx big big=size:>=1M", ptr);
  snprintf(want_a, sizeof want_a, " %llx ", ptr);
  int version = 0, js = 0, j_then_a = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "v ", 2)) version = (int)strtol(line + 2, NULL, 16);
    if (line[0] == 'j') {
      js++;
      CHECK(strstr(line, want_j) != NULL, "j line '%s' (expected '%s')", line, want_j);
      CHECK(!strncmp(line, "j ", 2) && strstr(line, " 0 0 "), "rule index 0, device 0: %s", line);
    }
    if (line[0] == 'a' && strstr(line, want_a) && last[0] == 'j') j_then_a = 1;
    snprintf(last, sizeof last, "%s", line);
  }
  fclose(f);
  CHECK(version == 4, "trace version %d", version);
  CHECK(js == 1, "%d j lines (one rule-tagged allocation)", js);
  CHECK(j_then_a, "the j line comes just before its allocation's a line");
}

int main(int argc, char **argv) {
  const char *child = check_child_main(argc, argv);
  if (child) {
    if (!strncmp(child, "first", 5)) {
      child_first(!strcmp(child, "first-api"));
      return check_child_summary(child);
    }
    must_malloc(1); /* activates the shim */
    if (!strcmp(child, "lib")) child_lib();
    else if (!strcmp(child, "site")) child_site();
    else if (!strcmp(child, "size")) child_size();
    else if (!strcmp(child, "phase")) child_phase();
    else if (!strcmp(child, "phase-rt")) child_phase_rt();
    else if (!strcmp(child, "capture")) child_capture();
    else if (!strcmp(child, "order")) child_order();
    else if (!strcmp(child, "explicit")) child_explicit();
    else if (!strcmp(child, "api")) child_api();
    else if (!strcmp(child, "malformed")) child_malformed();
    else if (!strcmp(child, "badenv")) child_badenv();
    else if (!strcmp(child, "ctl")) child_ctl();
    else if (!strcmp(child, "trace")) child_trace();
    else if (!strcmp(child, "swap")) child_swap();
    return check_child_summary(child);
  }
  if (!shim_active() && !dlsym(RTLD_DEFAULT, "vmmshim_set_tag_rules")) {
    printf("FAIL: the shim is not preloaded\n");
    return 1;
  }
  check_run_child("lib", "VMMSHIM_TAG_RULES=a=lib:librules_a.so;b=lib:*/librules_b*", NULL);
  check_run_child("site", "VMMSHIM_TAG_RULES=loader=site:rules_outer_*", NULL);
  check_run_child("size", "VMMSHIM_TAG_RULES=big=size:>=1M;small=size:<4K", NULL);
  check_run_child("phase", "VMMSHIM_TAG_RULES=load=phase:before-launch;run=phase:after-launch", NULL);
  check_run_child("phase-rt", "VMMSHIM_TAG_RULES=load=phase:before-launch;run=phase:after-launch", NULL);
  check_run_child("capture", "VMMSHIM_TAG_RULES=graphs=capture", NULL);
  check_run_child("order", "VMMSHIM_TAG_RULES=both=all:lib:librules_a*,size:>=1M;a=lib:librules_a*;first=size:>=1K;"
                           "second=size:>=1M", NULL);
  check_run_child("explicit", "VMMSHIM_TAG_RULES=big=size:>=1M", "VMMSHIM_TAG=proc", NULL);
  check_run_child("first", "VMMSHIM_TAG=proc", NULL);
  check_run_child("first-api", "VMMSHIM_TAG=proc", NULL);
  check_run_child("api", NULL);
  check_run_child("malformed", NULL);
  check_run_child("badenv", "VMMSHIM_TAG_RULES=a=lib:x;b=siz:>=1", NULL);
  CHECK(strstr(check_child_output, "VMMSHIM_TAG_RULES: rule 2 ('b=siz:>=1'), at character 11: unknown matcher") &&
            strstr(check_child_output, "running without tag rules"),
        "the error of a bad VMMSHIM_TAG_RULES");
  check_run_child("ctl", "VMMSHIM_TAG_RULES=x=size:>=1M", NULL);
  check_run_child("swap", NULL);
  char path[64], env[96];
  snprintf(path, sizeof path, "/tmp/vmmshim-rules-%d.trace", (int)getpid());
  snprintf(env, sizeof env, "VMMSHIM_TRACE=%s", path);
  check_run_child("trace", "VMMSHIM_TAG_RULES=big=size:>=1M", env, NULL);
  check_trace(path, check_child_output);
  unlink(path);
  return check_summary();
}
