/* test_shim_disk: disk-mode sleep (VMMSHIM_SLEEP_DISK) on the emulation, one process per
 * scenario, each with a directory of its own (VMMSHIM_DISK_DIR) that the parent makes and checks.
 *
 *   roundtrip  a tag of blocks whose sizes are no multiples of 4096, one larger than a staging
 *              buffer (several pieces), sleeps to disk: device memory given back, one file of the
 *              tag's bytes, mode 0600, named for uid, pid and tag; untagged memory untouched;
 *              the wake brings every byte back and removes the file; a second sleep left asleep
 *              at exit: a forked child's exit leaves the file, the parent finds the directory
 *              empty after the child ended.
 *   pair       two processes sleep the same tag into the same directory at once: two files,
 *              each process gets its own bytes back.
 *   writefail  a write that fails (ENOSPC, then a write that makes no progress: EIO) leaves the
 *              tag awake with every byte, no file, the error and its errno name in the answer;
 *              staging memory that cannot be pinned (the first sleep pins it) does the same,
 *              with the CUDA error; then a sleep works.
 *   readfail   the file truncated while asleep: the wake fails (ENODATA), the tag stays asleep
 *              with its file; restored, the wake brings every byte back. The file removed:
 *              ENOENT, still asleep; put back, the wake works.
 *   trace      (the roundtrip, traced) the sleep's w record has mode 3.
 *   inflight   a wake of 256 MiB (8 pieces): before its first copy to the device is made (held
 *              in the emulation), several reads of the file are under way (native AIO:
 *              io_submit calls), every byte comes back; the sleep allocated the file's blocks
 *              once, for all its bytes, before its first write; a preallocation refused for
 *              space (ENOSPC) fails the sleep before anything is written: the tag awake, intact,
 *              no file.
 *   inflight-sync  the same wake where the kernel refuses AIO (io_setup fails): the reads are
 *              made at once (pread), still several before the first copy, every byte back.
 *   dir        vmmshim_set_disk_dir refuses a missing path, a file and an unwritable directory
 *              (when not root), and takes a writable directory: the next sleep's file is there.
 *
 * Write failures are injected by this program's own pwrite (exported with -rdynamic, so the
 * shim's calls reach it), which passes through unless a scenario arms it; its own pread,
 * fallocate and syscall count what the shim does (and can refuse AIO or preallocation). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudart_emu.h"
#include "emu.h"
#include "vmmshim.h"
#define CHECK_SHIM_HELPERS
#include "check.h"

#define MiB (1ull << 20)

#pragma weak vmmshim_sleep
#pragma weak vmmshim_wake
#pragma weak vmmshim_set_tag
#pragma weak vmmshim_tag_stats
#pragma weak vmmshim_api_version
#pragma weak vmmshim_set_disk_dir

/* ---- the injection point: 0 pass through; 1 ENOSPC from the second call on; 2 no progress ---- */
static int g_fail_write, g_writes;

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  g_writes++;
  if (g_fail_write == 1 && g_writes > 1) {
    errno = ENOSPC;
    return -1;
  }
  if (g_fail_write == 2) return 0;
  return syscall(SYS_pwrite64, fd, buf, n, off);
}

/* ---- counters of the wake's reads and the sleep's preallocation ---- */
static int g_no_aio, g_submits, g_preads, g_fallocs, g_falloc_fail, g_writes_at_falloc = -1;
static off_t g_falloc_len;

long syscall(long n, ...) {
  static long (*real)(long, ...);
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "syscall");
  va_list ap;
  va_start(ap, n);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (n == SYS_io_setup && g_no_aio) {
    errno = ENOSYS;
    return -1;
  }
  if (n == SYS_io_submit) __atomic_fetch_add(&g_submits, 1, __ATOMIC_SEQ_CST);
  return real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  __atomic_fetch_add(&g_preads, 1, __ATOMIC_SEQ_CST);
  return syscall(SYS_pread64, fd, buf, n, off);
}

int fallocate(int fd, int mode, off_t off, off_t len) {
  g_fallocs++;
  g_falloc_len += len;
  if (g_writes_at_falloc < 0) g_writes_at_falloc = g_writes;
  if (g_falloc_fail) {
    errno = ENOSPC;
    return -1;
  }
  return (int)syscall(SYS_fallocate, fd, mode, off, len);
}

static vmmshim_sleep_result_t g_res;
static char g_dir[256];

static int do_sleep(const char *tag) {
  memset(&g_res, 0, sizeof g_res);
  return vmmshim_sleep(tag, VMMSHIM_SLEEP_DISK, &g_res, sizeof g_res);
}
static int do_wake(const char *tag) {
  memset(&g_res, 0, sizeof g_res);
  return vmmshim_wake(tag, 0, &g_res, sizeof g_res);
}

/* The sleep files in dir: their count, the first one's path in path (may be NULL). */
static int files_in(const char *dir, char *path, size_t n) {
  DIR *d = opendir(dir);
  int count = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, "vmmshim-", 8) != 0) continue;
    if (!count++ && path) snprintf(path, n, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  return count;
}

static int mapped_as(const void *p) { return emu_host_mapped((CUdeviceptr)(uintptr_t)p); }

enum { NB = 3 };
static const size_t g_sizes[NB] = {3 * MiB + 123, 5 * MiB + 7, 40 * MiB + 1}; /* the last: two pieces */
static void *g_blk[NB];

static void make_tag(const char *tag, unsigned long long seed) {
  CHECK(vmmshim_set_tag(tag) == 0, "set tag %s", tag);
  for (int i = 0; i < NB; i++) {
    g_blk[i] = must_malloc(g_sizes[i]);
    if (g_blk[i]) pat_fill(g_blk[i], g_sizes[i], seed + (unsigned)i);
  }
  vmmshim_set_tag(NULL);
}

static bool tag_intact(unsigned long long seed) {
  for (int i = 0; i < NB; i++)
    if (!g_blk[i] || mapped_as(g_blk[i]) != 0 || pat_check(g_blk[i], g_sizes[i], seed + (unsigned)i) != (size_t)-1)
      return false;
  return true;
}

static bool tag_unmapped(void) {
  for (int i = 0; i < NB; i++)
    if (!g_blk[i] || mapped_as(g_blk[i]) != -1) return false;
  return true;
}

static void scenario_roundtrip(void) {
  void *outside = must_malloc(1 * MiB + 5);
  if (outside) pat_fill(outside, 1 * MiB + 5, 99);
  make_tag("kv", 1);
  int rc = do_sleep("kv");
  CHECK(rc == 0, "sleep kv to disk: %d (%s)", rc, g_res.reason);
  CHECK(g_res.released >= 48 * MiB && g_res.to_host >= 48 * MiB, "released %llu, written %llu",
        (unsigned long long)g_res.released, (unsigned long long)g_res.to_host);
  CHECK(tag_unmapped(), "every block of kv is off the device");
  vmmshim_tag_stats_t st = shim_tag_stats("kv");
  CHECK(st.asleep && st.disk == g_res.to_host && st.host_copied == 0, "kv: asleep %d, disk %llu", st.asleep,
        (unsigned long long)st.disk);
  char path[512] = "";
  CHECK(files_in(g_dir, path, sizeof path) == 1, "one file in the directory");
  struct stat sb;
  CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600 && (uint64_t)sb.st_size == st.disk,
        "%s: mode %o, %lld bytes", path, (unsigned)(sb.st_mode & 0777), (long long)sb.st_size);
  char want[64];
  snprintf(want, sizeof want, "-u%u-p%d-", (unsigned)getuid(), (int)getpid());
  CHECK(strstr(path, want) && strstr(path, "-kv-"), "the name holds uid, pid and tag: %s", path);
  CHECK(outside && mapped_as(outside) == 0 && pat_check(outside, 1 * MiB + 5, 99) == (size_t)-1,
        "untagged memory untouched");
  rc = do_wake("kv");
  CHECK(rc == 0 && g_res.restored >= 48 * MiB, "wake kv: %d (%s)", rc, g_res.reason);
  CHECK(tag_intact(1), "every byte of kv back at its address");
  CHECK(files_in(g_dir, NULL, 0) == 0, "the file is gone after the wake");
  CHECK(shim_tag_stats("kv").disk == 0 && !shim_tag_stats("kv").asleep, "kv awake");
  rc = do_sleep("kv");
  CHECK(rc == 0 && files_in(g_dir, NULL, 0) == 1, "asleep again, left so at exit: %d", rc);
  pid_t child = fork();
  if (child == 0) exit(0); /* runs the exit handlers: a forked child's leave the parent's files */
  int status = -1;
  CHECK(child > 0 && waitpid(child, &status, 0) == child && files_in(g_dir, NULL, 0) == 1,
        "a forked child's exit leaves the file");
}

/* The second process of "pair": sleeps kv while the first one's kv sleeps. */
static void scenario_second(void) {
  make_tag("kv", 20);
  CHECK(do_sleep("kv") == 0, "second: sleep (%s)", g_res.reason);
  CHECK(files_in(g_dir, NULL, 0) == 2, "second: two files in the directory");
  CHECK(do_wake("kv") == 0 && tag_intact(20), "second: its own bytes back (%s)", g_res.reason);
}

static void scenario_pair(void) {
  make_tag("kv", 10);
  CHECK(do_sleep("kv") == 0 && files_in(g_dir, NULL, 0) == 1, "first: asleep, one file (%s)", g_res.reason);
  char env[300];
  snprintf(env, sizeof env, "VMMSHIM_DISK_DIR=%s", g_dir);
  check_run_child("second", env, NULL);
  CHECK(files_in(g_dir, NULL, 0) == 1, "first: only its own file left");
  CHECK(do_wake("kv") == 0 && tag_intact(10), "first: its own bytes back (%s)", g_res.reason);
}

static void scenario_writefail(void) {
  make_tag("kv", 3);
  emu_fail_next("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY, 1); /* the first sleep pins them */
  int rc = do_sleep("kv");
  CHECK(rc == -EIO && strstr(g_res.reason, "staging") && strstr(g_res.reason, "CUDA_ERROR_OUT_OF_MEMORY"),
        "no staging memory: %d (%s)", rc, g_res.reason);
  CHECK(tag_intact(3) && files_in(g_dir, NULL, 0) == 0, "nothing moved, no file");
  g_fail_write = 1, g_writes = 0;
  rc = do_sleep("kv");
  CHECK(rc == -ENOSPC && strstr(g_res.reason, "ENOSPC"), "ENOSPC: %d (%s)", rc, g_res.reason);
  CHECK(tag_intact(3) && !shim_tag_stats("kv").asleep && shim_tag_stats("kv").disk == 0, "kv awake with every byte");
  CHECK(files_in(g_dir, NULL, 0) == 0, "no file left");
  g_fail_write = 2;
  rc = do_sleep("kv");
  CHECK(rc == -EIO && strstr(g_res.reason, "EIO"), "no progress: %d (%s)", rc, g_res.reason);
  CHECK(tag_intact(3) && files_in(g_dir, NULL, 0) == 0, "kv awake with every byte, no file");
  g_fail_write = 0;
  rc = do_sleep("kv");
  CHECK(rc == 0 && tag_unmapped(), "then the sleep works: %d (%s)", rc, g_res.reason);
  CHECK(do_wake("kv") == 0 && tag_intact(3), "and the wake");
}

static bool put_back(const char *path, const char *b, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  bool ok = fd >= 0 && syscall(SYS_pwrite64, fd, b, n, 0) == (long)n;
  if (fd >= 0) close(fd);
  return ok;
}

static void scenario_readfail(void) {
  make_tag("kv", 4);
  CHECK(do_sleep("kv") == 0, "sleep (%s)", g_res.reason);
  char path[512] = "";
  size_t n = 0;
  char *copy = files_in(g_dir, path, sizeof path) == 1 ? check_slurp(path, &n) : NULL;
  CHECK(copy && n >= 48 * MiB, "the file read back: %zu bytes", n);
  if (!copy) return;
  CHECK(truncate(path, (off_t)(n / 2)) == 0, "truncated");
  int rc = do_wake("kv");
  CHECK(rc == -ENODATA && strstr(g_res.reason, "ENODATA"), "wake of a truncated file: %d (%s)", rc, g_res.reason);
  CHECK(shim_tag_stats("kv").asleep && shim_tag_stats("kv").disk == n && tag_unmapped(), "kv still asleep");
  CHECK(files_in(g_dir, NULL, 0) == 1, "its file stays");
  CHECK(put_back(path, copy, n), "file restored");
  rc = do_wake("kv");
  CHECK(rc == 0 && tag_intact(4), "the retry brings every byte back: %d (%s)", rc, g_res.reason);
  CHECK(files_in(g_dir, NULL, 0) == 0, "file gone");
  CHECK(do_sleep("kv") == 0 && files_in(g_dir, path, sizeof path) == 1, "asleep again");
  free(copy);
  copy = check_slurp(path, &n);
  CHECK(copy && unlink(path) == 0, "file removed");
  rc = do_wake("kv");
  CHECK(rc == -ENOENT && strstr(g_res.reason, "ENOENT"), "wake without its file: %d (%s)", rc, g_res.reason);
  CHECK(shim_tag_stats("kv").asleep && tag_unmapped(), "kv still asleep");
  CHECK(copy && put_back(path, copy, n), "file put back");
  rc = do_wake("kv");
  CHECK(rc == 0 && tag_intact(4), "the retry brings every byte back: %d (%s)", rc, g_res.reason);
  free(copy);
}

static int g_wake_rc;
static void *wake_big(void *arg) {
  (void)arg;
  g_wake_rc = do_wake("big");
  return NULL;
}

static void scenario_inflight(bool sync_reads) {
  g_no_aio = sync_reads;
  enum { NBIG = 4 };
  void *b[NBIG];
  CHECK(vmmshim_set_tag("big") == 0, "set tag big");
  for (int i = 0; i < NBIG; i++) {
    b[i] = must_malloc(64 * MiB);
    if (b[i]) pat_fill_sparse(b[i], 64 * MiB, 30 + (unsigned)i);
  }
  vmmshim_set_tag(NULL);
  g_writes = 0;
  CHECK(do_sleep("big") == 0, "sleep 256 MiB to disk (%s)", g_res.reason);
  CHECK(g_fallocs == 1 && g_falloc_len >= 256 * (off_t)MiB && g_writes_at_falloc == 0,
        "the file's blocks allocated once, for every byte, before the first write: %d calls, %lld bytes, after %d writes",
        g_fallocs, (long long)g_falloc_len, g_writes_at_falloc);
  g_submits = g_preads = 0;
  emu_hold_next("cuMemcpyHtoDAsync");
  pthread_t t;
  bool started = pthread_create(&t, NULL, wake_big, NULL) == 0;
  CHECK(started && emu_wait_held(20000), "the wake's first copy to the device is held");
  int submits = __atomic_load_n(&g_submits, __ATOMIC_SEQ_CST), preads = __atomic_load_n(&g_preads, __ATOMIC_SEQ_CST);
  if (sync_reads)
    CHECK(submits == 0 && preads >= 2, "without AIO: %d reads made before the first piece goes to the device", preads);
  else
    CHECK(submits >= 2, "%d reads under way (io_submit) before the first piece goes to the device (%d preads)", submits,
          preads);
  emu_release_hold();
  if (started) pthread_join(t, NULL);
  bool intact = true;
  for (int i = 0; i < NBIG; i++) intact = intact && b[i] && pat_check_sparse(b[i], 64 * MiB, 30 + (unsigned)i) == (size_t)-1;
  CHECK(g_wake_rc == 0 && intact, "every byte back: %d (%s)", g_wake_rc, g_res.reason);
  if (!sync_reads) CHECK(g_submits >= 8, "every piece read through AIO: %d", g_submits);
  CHECK(files_in(g_dir, NULL, 0) == 0, "file gone");
  g_falloc_fail = 1;
  g_writes = 0;
  int rc = do_sleep("big");
  CHECK(rc == -ENOSPC && strstr(g_res.reason, "ENOSPC") && g_writes == 0, "no room for the blocks: %d (%s), %d writes",
        rc, g_res.reason, g_writes);
  intact = true;
  for (int i = 0; i < NBIG; i++) intact = intact && b[i] && mapped_as(b[i]) == 0 &&
                                  pat_check_sparse(b[i], 64 * MiB, 30 + (unsigned)i) == (size_t)-1;
  CHECK(intact && !shim_tag_stats("big").asleep && files_in(g_dir, NULL, 0) == 0, "the tag awake, intact, no file");
  g_falloc_fail = 0;
  for (int i = 0; i < NBIG; i++) cudaFree(b[i]);
}

static void scenario_dir(void) {
  char file[300], sub[300];
  snprintf(file, sizeof file, "%s/plain", g_dir);
  snprintf(sub, sizeof sub, "%s/sub", g_dir);
  FILE *f = fopen(file, "w");
  if (f) fclose(f);
  CHECK(vmmshim_set_disk_dir("/nonexistent/vmmshim") == -ENOENT, "a missing directory: ENOENT");
  CHECK(vmmshim_set_disk_dir(file) == -ENOTDIR, "a file: ENOTDIR");
  CHECK(vmmshim_set_disk_dir("") == -EINVAL && vmmshim_set_disk_dir(NULL) == -EINVAL, "empty: EINVAL");
  CHECK(mkdir(sub, 0500) == 0, "mkdir");
  if (geteuid() != 0) CHECK(vmmshim_set_disk_dir(sub) == -EACCES, "an unwritable directory: EACCES");
  chmod(sub, 0700);
  CHECK(vmmshim_set_disk_dir(sub) == 0, "a writable directory");
  CHECK(files_in(sub, NULL, 0) == 0, "setting it creates nothing");
  make_tag("kv", 5);
  CHECK(do_sleep("kv") == 0 && files_in(sub, NULL, 0) == 1 && files_in(g_dir, NULL, 0) == 0, "the file is there");
  CHECK(do_wake("kv") == 0 && tag_intact(5) && files_in(sub, NULL, 0) == 0, "woken, file gone");
  rmdir(sub);
  unlink(file);
}

static void run_scenario(const char *name) {
  const char *d = getenv("VMMSHIM_DISK_DIR");
  snprintf(g_dir, sizeof g_dir, "%s", d ? d : "");
  CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  CHECK(shim_active() == 1 && vmmshim_sleep, "the shim is active");
  if (!vmmshim_sleep) return;
  if (!strcmp(name, "roundtrip")) scenario_roundtrip();
  else if (!strcmp(name, "pair")) scenario_pair();
  else if (!strcmp(name, "second")) scenario_second();
  else if (!strcmp(name, "writefail")) scenario_writefail();
  else if (!strcmp(name, "readfail")) scenario_readfail();
  else if (!strcmp(name, "dir")) scenario_dir();
  else if (!strcmp(name, "inflight")) scenario_inflight(false);
  else if (!strcmp(name, "inflight-sync")) scenario_inflight(true);
  else CHECK(0, "unknown scenario %s", name);
}

/* Whether the trace holds a sleep record (w, kind 0) in mode 3 (disk) of a tag the g record
 * before it names kv. */
static bool traced_disk_sleep(const char *path) {
  FILE *f = fopen(path, "r");
  char line[512];
  bool hit = false;
  char named[64] = "";
  while (f && !hit && fgets(line, sizeof line, f)) {
    int kind = -1, mode = -1;
    if (sscanf(line, "g %*s %*s %*s %*s %*s %63s", named) == 1) continue;
    hit = sscanf(line, "w %*s %*s %d %*s %*s %d", &kind, &mode) == 2 && kind == 0 && mode == 3 && !strcmp(named, "kv");
  }
  if (f) fclose(f);
  return hit;
}

/* Runs a scenario in a directory of its own (traced there), then checks the directory holds no
 * sleep file. */
static void run_in_dir(const char *name) {
  char tmpl[] = "/tmp/vmmshim-disk-test-XXXXXX";
  char *dir = mkdtemp(tmpl);
  CHECK(dir != NULL, "mkdtemp: %s", strerror(errno));
  if (!dir) return;
  char env[300], trace[400], path[300];
  snprintf(env, sizeof env, "VMMSHIM_DISK_DIR=%s", dir);
  snprintf(path, sizeof path, "%s/trace.txt", dir);
  snprintf(trace, sizeof trace, "VMMSHIM_TRACE=%s", path);
  check_run_child(name, env, trace, NULL);
  CHECK(files_in(dir, NULL, 0) == 0, "%s: no file left after the process ended", name);
  if (!strcmp(name, "roundtrip")) CHECK(traced_disk_sleep(path), "the trace has kv's sleep in mode 3 (disk)");
  unlink(path);
  rmdir(dir);
}

int main(int argc, char **argv) {
  const char *child = check_child_main(argc, argv);
  if (child) {
    run_scenario(child);
    return check_child_summary(child);
  }
  CHECK(vmmshim_api_version && vmmshim_api_version() == VMMSHIM_API_VERSION, "the shim is preloaded, API version %d",
        vmmshim_api_version ? vmmshim_api_version() : -1);
  if (!vmmshim_api_version) return check_summary();
  run_in_dir("roundtrip");
  run_in_dir("pair");
  run_in_dir("writefail");
  run_in_dir("readfail");
  run_in_dir("dir");
  run_in_dir("inflight");
  run_in_dir("inflight-sync");
  return check_summary();
}
