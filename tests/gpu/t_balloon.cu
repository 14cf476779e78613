/* t_balloon: a trainer and a generator on one GPU under one group budget (VMMSHIM_ON_LIMIT=balloon,
 * docs/limits.md "Priorities and ballooning").
 *
 * The program starts itself twice (before it touches CUDA, so each child is a fresh process with
 * its own environment), in the group gpu-balloon-<pid> with a limit of BALLOON_LIMIT_MB (6144):
 *   generator  priority 0, its cache tag kv (BALLOON_KV_MB, 3072) cold (mapped): it produces a
 *              "token" after another, each the sum of its whole cache computed on the GPU;
 *   trainer    priority 10, VMMSHIM_ON_LIMIT=balloon:10: 2 GiB of weights, then a step that grows
 *              by 2 GiB past the limit, held 1 s, then freed.
 * Checks: the trainer's growth is admitted; the generator's kv leaves the device (served from host
 * memory) while the trainer holds it, and every token equals the first (the same bytes, read over
 * the link); after the trainer frees, kv comes back to the device by itself. INFO: the growth's
 * time, the part of it the generator's lend took (its `demote` request, timed by the generator's
 * shim: host memory obtained on the way included; BALLOON_HOST_RESERVE_MB makes it ahead), the
 * tokens' times before, during and after. The children write their results to files in
 * a directory of the parent's; the parent makes the checks. */
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test.cuh"

#define MiB (1ull << 20)

__global__ void k_token(const uint32_t *p, size_t n, unsigned long long *out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    s += p[i] * 2654435761u + (uint32_t)i;
  atomicAdd(out, s);
}

static char g_dir[512];

static bool have(const char *name) {
  char path[700];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  return stat(path, &st) == 0;
}

static void mark(const char *name) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
}

static FILE *g_out; /* the child's results: "ok NAME", "bad NAME: why", "INFO ..." */

static bool wait_for(const char *name, double ms) {
  double t0 = now_ms();
  while (!have(name) && now_ms() - t0 < ms) usleep(5000);
  return have(name);
}

/* The kv tag's figures in this process (the shim's own call, found at run time). */
static bool kv_on_host(bool *known) {
  typedef int (*fn_t)(vmmshim_tag_stats_t *, int, size_t);
  fn_t fn = (fn_t)dlsym(RTLD_DEFAULT, "vmmshim_tag_stats");
  vmmshim_tag_stats_t t[VMMSHIM_MAX_TAGS];
  *known = false;
  int n = fn ? fn(t, VMMSHIM_MAX_TAGS, sizeof t[0]) : 0;
  for (int i = 0; i < n && i < VMMSHIM_MAX_TAGS; i++)
    if (!strcmp(t[i].name, "kv")) {
      *known = true;
      return t[i].host_mapped > 0;
    }
  return false;
}

static int generator(void) {
  size_t n = strtoull(getenv("BALLOON_KV_MB"), NULL, 10) * MiB;
  void *kv;
  unsigned long long *d, first = 0, tok = 0;
  typedef int (*set_tag_fn)(const char *);
  set_tag_fn set_tag = (set_tag_fn)dlsym(RTLD_DEFAULT, "vmmshim_set_tag");
  if (set_tag) set_tag("kv"); /* the cache alone is cold: the token's counter stays on the device */
  CK(cudaMalloc(&kv, n));
  if (set_tag) set_tag(NULL);
  CK(cudaMalloc(&d, sizeof *d));
  fill(kv, n, 0xcafe, 0);
  CK(cudaDeviceSynchronize());
  mark("gen.ready");
  long tokens = 0, wrong = 0, while_out = 0;
  bool went_out = false, came_back = false, known = false;
  double t_end = now_ms() + 60000, t_back = 0, ms_before = 0, ms_out = 0, ms_after = 0;
  long n_before = 0, n_after = 0;
  while (now_ms() < t_end) {
    double t = now_ms();
    CK(cudaMemset(d, 0, sizeof *d));
    k_token<<<sm_count() * 4, 256>>>((const uint32_t *)kv, n / 4, d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&tok, d, sizeof tok, cudaMemcpyDeviceToHost));
    double took = now_ms() - t;
    if (tokens++ == 0) first = tok;
    else if (tok != first) wrong++;
    bool out = kv_on_host(&known);
    if (out) {
      went_out = true;
      while_out++;
      ms_out += took;
    } else if (!went_out) {
      n_before++;
      ms_before += took;
    } else {
      n_after++;
      ms_after += took;
      if (!came_back) {
        came_back = true;
        t_back = now_ms();
      }
    }
    if (came_back && now_ms() - t_back > 500) break;
    if (have("trainer.done") && !went_out) break; /* it never went out: nothing more to see */
  }
  fprintf(g_out, "INFO generator: %ld tokens; mean %.2f ms before, %.2f ms with kv on host memory (%ld), %.2f ms "
          "after it came back\n", tokens, n_before ? ms_before / n_before : 0, while_out ? ms_out / while_out : 0,
          while_out, n_after ? ms_after / n_after : 0);
  fprintf(g_out, known ? "ok kv-known\n" : "bad kv-known: vmmshim_tag_stats has no tag kv (vmmshim_set_tag)\n");
  fprintf(g_out, wrong == 0 && tokens > 10 ? "ok tokens\n" : "bad tokens: %ld of %ld tokens differ from the first\n",
          wrong, tokens);
  fprintf(g_out, went_out && while_out > 0 ? "ok kv-lent\n"
                                           : "bad kv-lent: kv never left the device while the trainer grew\n");
  fprintf(g_out, came_back ? "ok kv-back\n" : "bad kv-back: kv was not back on the device 60 s in\n");
  size_t bad = errors_in(kv, n, 0xcafe);
  fprintf(g_out, bad == 0 ? "ok kv-bytes\n" : "bad kv-bytes: %zu words differ\n", bad);
  return 0;
}

static int trainer(void) {
  if (!wait_for("gen.ready", 60000)) {
    fprintf(g_out, "bad trainer-start: the generator did not get ready\n");
    return 0;
  }
  void *w, *step = NULL;
  CK(cudaMalloc(&w, 2048 * MiB));
  usleep(300000); /* the generator makes tokens from device memory meanwhile */
  double t = now_ms();
  cudaError_t e = cudaMalloc(&step, 2048 * MiB);
  double ms = now_ms() - t;
  fprintf(g_out, "INFO trainer: its 2 GiB growth past the limit took %.1f ms (%s)\n", ms, cudaGetErrorName(e));
  fprintf(g_out, e == cudaSuccess ? "ok growth\n" : "bad growth: cudaMalloc of 2 GiB past the limit: %s\n",
          cudaGetErrorName(e));
  if (e == cudaSuccess) {
    fill(step, 2048 * MiB, 7, 0);
    CK(cudaDeviceSynchronize());
    usleep(1000000);
    CK(cudaFree(step));
  }
  mark("trainer.done");
  CK(cudaFree(w));
  return 0;
}

static int run_child(const char *role) {
  snprintf(g_dir, sizeof g_dir, "%s", getenv("BALLOON_DIR"));
  char path[700];
  snprintf(path, sizeof path, "%s/%s.out", g_dir, role);
  g_out = fopen(path, "w");
  if (!g_out) return 1;
  setvbuf(g_out, NULL, _IOLBF, 0);
  int rc = !strcmp(role, "generator") ? generator() : trainer();
  fclose(g_out);
  return rc;
}

static pid_t spawn(const char *role, const char *const *env) {
  pid_t p = fork();
  if (p == 0) {
    for (int i = 0; env[i]; i += 2) setenv(env[i], env[i + 1], 1);
    execl("/proc/self/exe", "t_balloon", role, (char *)NULL);
    _exit(127);
  }
  return p;
}

/* The child's result lines become the parent's checks. */
static void relay(const char *role) {
  char path[700], line[600];
  snprintf(path, sizeof path, "%s/%s.out", g_dir, role);
  FILE *f = fopen(path, "r");
  check(f != NULL, role, "no results from the %s (%s)", role, path);
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!strncmp(line, "INFO ", 5)) {
      printf("%s\n", line);
    } else if (!strncmp(line, "ok ", 3)) {
      check(true, line + 3, "");
    } else if (!strncmp(line, "bad ", 4)) {
      char *colon = strchr(line + 4, ':');
      if (colon) *colon = 0;
      check(false, line + 4, "%s", colon ? colon + 2 : "");
    }
  }
  if (f) fclose(f);
}

/* The trainer shim's own account of its growth (VMMSHIM_LOG=info): the whole wait and the part
 * of it the lender's moves took, as the lender timed them. */
static void lend_info(void) {
  char path[700], line[600];
  snprintf(path, sizeof path, "%s/trainer.log", g_dir);
  FILE *f = fopen(path, "r");
  bool seen = false;
  while (f && fgets(line, sizeof line, f)) {
    const char *at = strstr(line, "lent by lower-priority members");
    if (!at) continue;
    line[strcspn(line, "\n")] = 0;
    printf("INFO trainer's shim: %s\n", at);
    seen = true;
  }
  if (f) fclose(f);
  if (!seen) printf("INFO trainer's shim: no line about a lend in %s\n", path);
}

int main(int argc, char **argv) {
  g_prog = "balloon";
  if (argc > 1) return run_child(argv[1]);
  const char *lib = getenv("LD_PRELOAD");
  if (!lib || !*lib) {
    check(false, "setup", "run under the shim (LD_PRELOAD): the children need it");
    return finish();
  }
  snprintf(g_dir, sizeof g_dir, "/tmp/vmmshim-balloon-%d", (int)getpid());
  mkdir(g_dir, 0700);
  char group[64];
  snprintf(group, sizeof group, "gpu-balloon-%d", (int)getpid());
  const char *limit = getenv("BALLOON_LIMIT_MB") ? getenv("BALLOON_LIMIT_MB") : "6144";
  char limit_text[32];
  snprintf(limit_text, sizeof limit_text, "%sM", limit);
  const char *kvmb = getenv("BALLOON_KV_MB") ? getenv("BALLOON_KV_MB") : "3072";
  /* BALLOON_HOST_RESERVE_MB: the generator's VMMSHIM_HOST_RESERVE. Without it the lend obtains its
   * host memory while the trainer waits; the two runs of tests/gpu/run.sh show the difference. */
  const char *reserve = getenv("BALLOON_HOST_RESERVE_MB") ? getenv("BALLOON_HOST_RESERVE_MB") : "0";
  char reserve_text[32];
  snprintf(reserve_text, sizeof reserve_text, "%sM", reserve);
  printf("INFO generator: VMMSHIM_HOST_RESERVE=%s (host memory made ahead for the lend)\n", reserve_text);
  const char *gen_env[] = {"BALLOON_DIR", g_dir, "BALLOON_KV_MB", kvmb, "VMMSHIM_LIMIT_GROUP", group,
                           "VMMSHIM_LIMIT", limit_text, "VMMSHIM_PRIORITY", "0", "VMMSHIM_COLD_TAGS", "kv",
                           "VMMSHIM_HOST_RESERVE", reserve_text, NULL};
  char tr_log[600];
  snprintf(tr_log, sizeof tr_log, "info:%s/trainer.log", g_dir);
  const char *tr_env[] = {"BALLOON_DIR", g_dir, "VMMSHIM_LIMIT_GROUP", group, "VMMSHIM_PRIORITY", "10",
                          "VMMSHIM_ON_LIMIT", "balloon:10", "VMMSHIM_RELEASE_THRESHOLD", "0",
                          "VMMSHIM_LOG", tr_log, NULL};
  pid_t g = spawn("generator", gen_env);
  pid_t t = spawn("trainer", tr_env);
  int st_g = 0, st_t = 0;
  waitpid(t, &st_t, 0);
  waitpid(g, &st_g, 0);
  check(WIFEXITED(st_t) && WEXITSTATUS(st_t) == 0, "trainer-exit", "the trainer ended with status 0x%x", st_t);
  check(WIFEXITED(st_g) && WEXITSTATUS(st_g) == 0, "generator-exit", "the generator ended with status 0x%x", st_g);
  relay("trainer");
  lend_info();
  relay("generator");
  char shm[128];
  snprintf(shm, sizeof shm, "/dev/shm/vmmshim-%u-%s", (unsigned)geteuid(), group);
  unlink(shm);
  return finish();
}
