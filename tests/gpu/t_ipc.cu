/* t_ipc: CUDA IPC between two processes on one GPU (cudaIpcGetMemHandle / cudaIpcOpenMemHandle /
 * cudaIpcCloseMemHandle), run with and without the shim by tests/gpu/run.sh.
 *
 * The exporter allocates three blocks (4 MiB, 3000 bytes: inside a handle the pool shares, and
 * IPC_BIG_MIB MiB: several handles when VMMSHIM_MAX_HANDLE is small), writes a pattern and
 * starts an importer (this program again, "import" mode), which opens the handles, checks the
 * pattern, writes its own and waits. The exporter checks the importer's writes, frees the big
 * block while it is still open there, allocates and writes one of the same size; the importer
 * checks that its view did not change, closes every handle and exits. Then a handle of a
 * process that has exited, and one of this process, must fail to open.
 * Exporter and importer talk over two pipes, one line at a time. */
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test.cuh"

enum { NBLK = 3 };
static const char *blk_name[NBLK] = {"4MiB", "3000B", "big"};

static void to_hex(const cudaIpcMemHandle_t *h, char *out) {
  const unsigned char *b = (const unsigned char *)h;
  for (size_t i = 0; i < sizeof *h; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

static bool from_hex(const char *s, cudaIpcMemHandle_t *h) {
  unsigned char *b = (unsigned char *)h;
  for (size_t i = 0; i < sizeof *h; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return false;
    b[i] = (unsigned char)v;
  }
  return true;
}

static bool read_line(FILE *f, char *buf, size_t n) {
  if (!fgets(buf, (int)n, f)) return false;
  buf[strcspn(buf, "\n")] = 0;
  return true;
}

/* ---- the importer: argv = import SIZE0 SIZE1 SIZE2 HANDLE0 HANDLE1 HANDLE2 ---- */
static int importer(char **argv, FILE *in, FILE *out) {
  g_prog = "ipc-importer";
  shim_as_expected(); /* started from a run under the shim, it is under the shim too */
  size_t size[NBLK];
  void *p[NBLK] = {0};
  for (int i = 0; i < NBLK; i++) {
    size[i] = strtoull(argv[2 + i], NULL, 0);
    cudaIpcMemHandle_t h;
    cudaError_t e = from_hex(argv[5 + i], &h) ? cudaIpcOpenMemHandle(&p[i], h, cudaIpcMemLazyEnablePeerAccess)
                                             : cudaErrorInvalidValue;
    check(e == cudaSuccess && p[i], blk_name[i], "cudaIpcOpenMemHandle: %s", cudaGetErrorName(e));
    if (e != cudaSuccess) p[i] = NULL;
  }
  for (int i = 0; i < NBLK; i++) {
    if (!p[i]) continue;
    size_t bad = errors_in(p[i], size[i], 1 + i);
    char name[64];
    snprintf(name, sizeof name, "%s-reads-exporter-data", blk_name[i]);
    check(bad == 0, name, "%zu words differ from the exporter's pattern", bad);
    fill(p[i], size[i], 11 + i, 0);
  }
  CK(cudaDeviceSynchronize());
  fprintf(out, "written\n");
  fflush(out);
  char line[64];
  if (!read_line(in, line, sizeof line) || strcmp(line, "freed")) {
    check(false, "protocol", "expected 'freed', got '%s'", line);
    return finish();
  }
  if (p[2]) {
    size_t bad = errors_in(p[2], size[2], 13);
    check(bad == 0, "big-unchanged-after-exporter-free",
          "%zu words of the block the exporter freed changed while it was open here", bad);
  }
  for (int i = 0; i < NBLK; i++) {
    if (!p[i]) continue;
    cudaError_t e = cudaIpcCloseMemHandle(p[i]);
    char name[64];
    snprintf(name, sizeof name, "%s-close", blk_name[i]);
    check(e == cudaSuccess, name, "cudaIpcCloseMemHandle: %s", cudaGetErrorName(e));
  }
  fprintf(out, "closed\n");
  fflush(out);
  return finish();
}

/* ---- "export-exit": one block's handle on stdout, then exit ---- */
static int export_and_exit(FILE *out) {
  void *p;
  CK(cudaMalloc(&p, 1 << 20));
  fill(p, 1 << 20, 7, 0);
  CK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  CK(cudaIpcGetMemHandle(&h, p));
  char hex[2 * sizeof h + 1];
  to_hex(&h, hex);
  fprintf(out, "%s\n", hex);
  fflush(out);
  return 0;
}

/* Starts this program with args; it reads fd 3 and writes fd 4, pipes from *to and to *from. */
static pid_t spawn(char *const args[], FILE **to, FILE **from) {
  int down[2], up[2];
  if (pipe(down) || pipe(up)) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    /* Out of the way first: a pipe's end may itself be 3 or 4. */
    int in = fcntl(down[0], F_DUPFD, 20), out = fcntl(up[1], F_DUPFD, 20);
    close(down[0]);
    close(down[1]);
    close(up[0]);
    close(up[1]);
    dup2(in, 3);
    dup2(out, 4);
    close(in);
    close(out);
    execv("/proc/self/exe", args);
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  *to = fdopen(down[1], "w");
  *from = fdopen(up[0], "r");
  return pid;
}

static int wait_exit(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* the helpers' side of the pipes: fds 3 (in) and 4 (out) */
  if (argc > 1 && !strcmp(argv[1], "import")) return importer(argv, fdopen(3, "r"), fdopen(4, "w"));
  if (argc > 1 && !strcmp(argv[1], "export-exit")) return export_and_exit(fdopen(4, "w"));

  g_prog = "ipc";
  bool shim = shim_as_expected();
  vmmshim_stats_t st;
  shim_stats(&st);
  size_t big = (size_t)(getenv("IPC_BIG_MIB") ? atoi(getenv("IPC_BIG_MIB")) : 160) << 20;
  size_t size[NBLK] = {4u << 20, 3000, big};
  void *p[NBLK];
  cudaIpcMemHandle_t h[NBLK];
  char hex[NBLK][2 * sizeof(cudaIpcMemHandle_t) + 1], sz[NBLK][32];
  for (int i = 0; i < NBLK; i++) {
    CK(cudaMalloc(&p[i], size[i]));
    fill(p[i], size[i], 1 + i, 0);
  }
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < NBLK; i++) {
    cudaError_t e = cudaIpcGetMemHandle(&h[i], p[i]);
    char name[64];
    snprintf(name, sizeof name, "%s-get-handle", blk_name[i]);
    check(e == cudaSuccess, name, "cudaIpcGetMemHandle: %s", cudaGetErrorName(e));
    if (e != cudaSuccess) return finish();
    to_hex(&h[i], hex[i]);
    snprintf(sz[i], sizeof sz[i], "%zu", size[i]);
  }
  if (shim) check(is_vmm(p[0]) && is_vmm(p[2]), "blocks-are-vmm", "the blocks are not the shim's VMM memory");
  /* A pointer inside a block is not a block's start: the driver refuses it for cudaMalloc memory. */
  cudaIpcMemHandle_t hx;
  cudaError_t ex = cudaIpcGetMemHandle(&hx, (char *)p[0] + 4096);
  printf("INFO ipc: cudaIpcGetMemHandle(block + 4096) -> %s\n", cudaGetErrorName(ex));
  if (ex != cudaSuccess) cudaGetLastError();

  char *args[] = {argv[0], (char *)"import", sz[0], sz[1], sz[2], hex[0], hex[1], hex[2], NULL};
  FILE *to, *from;
  pid_t pid = spawn(args, &to, &from);
  char line[256] = "";
  bool written = read_line(from, line, sizeof line) && !strcmp(line, "written");
  check(written, "importer-opened", "the importer said '%s'", line);
  if (written) {
    for (int i = 0; i < NBLK; i++) {
      size_t bad = errors_in(p[i], size[i], 11 + i);
      char name[64];
      snprintf(name, sizeof name, "%s-sees-importer-writes", blk_name[i]);
      check(bad == 0, name, "%zu words differ from the importer's pattern", bad);
    }
    /* Free the big block while the importer has it open, then take and write the same size:
     * the importer's view must not change. */
    CK(cudaFree(p[2]));
    void *again;
    CK(cudaMalloc(&again, size[2]));
    fill(again, size[2], 5, 0);
    CK(cudaDeviceSynchronize());
    printf("INFO ipc: after the free, a block of the same size at %p (the freed one was at %p)\n", again, p[2]);
    if (shim)
      check(again != p[2], "freed-while-open-not-reused", "the shim reused a block another process has open");
    fprintf(to, "freed\n");
    fflush(to);
    bool closed = read_line(from, line, sizeof line) && !strcmp(line, "closed");
    check(closed, "importer-closed", "the importer said '%s'", line);
    CK(cudaFree(again));
  }
  fclose(to);
  fclose(from);
  int rc = wait_exit(pid);
  check(rc == 0, "importer-exit", "the importer exited with %d", rc);
  for (int i = 0; i < 2; i++) CK(cudaFree(p[i]));
  if (shim) {
    vmmshim_stats_t s2;
    shim_stats(&s2);
    check(s2.bytes_in_use == st.bytes_in_use, "all-freed", "%llu bytes in use at the end (%llu at the start)",
          (unsigned long long)s2.bytes_in_use, (unsigned long long)st.bytes_in_use);
  }

  /* A handle of a process that has exited. */
  char *args2[] = {argv[0], (char *)"export-exit", NULL};
  pid = spawn(args2, &to, &from);
  bool got = read_line(from, line, sizeof line);
  fclose(to);
  fclose(from);
  int rc2 = wait_exit(pid);
  cudaIpcMemHandle_t dead;
  if (got && rc2 == 0 && from_hex(line, &dead)) {
    void *q = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&q, dead, cudaIpcMemLazyEnablePeerAccess);
    printf("INFO ipc: opening the handle of an exited process -> %s\n", cudaGetErrorName(e));
    check(e != cudaSuccess, "exited-exporter-refused", "opened at %p", q);
    if (e == cudaSuccess) cudaIpcCloseMemHandle(q);
    cudaGetLastError();
  } else {
    check(false, "exited-exporter", "the exporting child failed (exit %d, line '%s')", rc2, line);
  }
  /* This process's own handle. */
  void *own = NULL, *mine;
  CK(cudaMalloc(&mine, 1 << 20));
  cudaIpcMemHandle_t hm;
  CK(cudaIpcGetMemHandle(&hm, mine));
  cudaError_t e = cudaIpcOpenMemHandle(&own, hm, cudaIpcMemLazyEnablePeerAccess);
  printf("INFO ipc: opening this process's own handle -> %s\n", cudaGetErrorName(e));
  check(e != cudaSuccess, "own-handle-refused", "opened at %p", own);
  cudaGetLastError();
  CK(cudaFree(mine));
  return finish();
}
