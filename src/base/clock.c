/* clock.c: the shim's one clock (vmmshim/clock.h).
 *
 * Raw TSC readings are converted to CLOCK_MONOTONIC ns through kept segments: after every
 * calibration the rate is measured again over the whole time since the clock opened and a new
 * segment starts, ns = base_ns + (ticks - base_tsc) * mult, its base_ns where the previous
 * segment ends. A reading converts with the segment its ticks fall in, so converted times
 * stay continuous and never go back, also for a reading converted a few segments after it
 * was taken (the trace drains records up to 3 segments late: trace.c says why). */
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

#include "vmmshim/clock.h"
#include "vmmshim/base.h"

bool _vs_clock_tsc;

uint64_t _vs_now_ns(void) { return _vs_clock_mono_ns(); }

void _vs_sleep_us(unsigned us) {
  struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

#if defined(__x86_64__)
#define VS_CLK_SEGMENTS 8 /* a power of two */
static uint64_t vs_tsc_open, vs_mono_open; /* first calibration point */
static struct {
  uint64_t base_tsc, base_ns, mult; /* mult: ns per tick << 32 */
} vs_clk_seg[VS_CLK_SEGMENTS];
static unsigned vs_clk_newest, vs_clk_count;

static bool tsc_invariant(void) {
  int fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[8192];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  char *flags = strstr(buf, "\nflags");
  if (!flags) return false;
  char *eol = strchr(flags + 1, '\n');
  if (eol) *eol = 0;
  return strstr(flags, " constant_tsc") && strstr(flags, " nonstop_tsc");
}

uint64_t _vs_clock_to_ns(uint64_t raw) {
  if (!_vs_clock_tsc) return raw;
  unsigned i = vs_clk_newest;
  for (unsigned k = 1; k < vs_clk_count && raw < vs_clk_seg[i].base_tsc; k++) i = (i - 1) & (VS_CLK_SEGMENTS - 1);
  __int128 dt = (__int128)(int64_t)(raw - vs_clk_seg[i].base_tsc) * (__int128)vs_clk_seg[i].mult;
  return vs_clk_seg[i].base_ns + (uint64_t)(int64_t)(dt >> 32);
}

/* A (ticks, ns) pair read close together: the tighter of three tries, or false when the
 * thread was interrupted in each (a pair read across a preemption would skew the rate). */
static bool clock_sample(uint64_t *tsc, uint64_t *ns) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3; i++) {
    uint64_t t1 = __rdtsc(), n = _vs_clock_mono_ns(), t2 = __rdtsc();
    if (t2 - t1 < best) {
      best = t2 - t1;
      *tsc = t1 + (t2 - t1) / 2;
      *ns = n;
    }
  }
  return best < 20000; /* ~5-10 us at today's rates; clock_gettime takes ~50 ns */
}

void _vs_clock_calibrate(void) {
  uint64_t t, ns;
  if (!_vs_clock_tsc || !clock_sample(&t, &ns)) return;
  if (t <= vs_clk_seg[vs_clk_newest].base_tsc || ns <= vs_mono_open) return;
  uint64_t mult = (uint64_t)(((unsigned __int128)(ns - vs_mono_open) << 32) / (t - vs_tsc_open));
  uint64_t base_ns = _vs_clock_to_ns(t);
  unsigned i = (vs_clk_newest + 1) & (VS_CLK_SEGMENTS - 1);
  vs_clk_seg[i].base_tsc = t;
  vs_clk_seg[i].base_ns = base_ns;
  vs_clk_seg[i].mult = mult;
  vs_clk_newest = i;
  if (vs_clk_count < VS_CLK_SEGMENTS) vs_clk_count++;
}

void _vs_clock_open(void) {
  _vs_clock_tsc = tsc_invariant();
  if (!_vs_clock_tsc) return;
  /* A first rate over 1 ms; every calibration refines it. */
  if (!clock_sample(&vs_tsc_open, &vs_mono_open)) {
    _vs_clock_tsc = false; /* never an undisturbed read: use clock_gettime */
    return;
  }
  uint64_t t = 0, ns = 0, until = vs_mono_open + 1000000;
  for (int tries = 0; tries < 10; tries++) {
    while (_vs_clock_mono_ns() < until) {
    }
    if (clock_sample(&t, &ns) && t > vs_tsc_open) break;
    until += 100000;
  }
  if (t <= vs_tsc_open || ns <= vs_mono_open) {
    _vs_clock_tsc = false;
    return;
  }
  vs_clk_seg[0].mult = (uint64_t)(((unsigned __int128)(ns - vs_mono_open) << 32) / (t - vs_tsc_open));
  vs_clk_seg[0].base_tsc = t;
  vs_clk_seg[0].base_ns = ns;
  vs_clk_newest = 0;
  vs_clk_count = 1;
}
#else
uint64_t _vs_clock_to_ns(uint64_t raw) { return raw; }
void _vs_clock_calibrate(void) {}
void _vs_clock_open(void) {}
#endif
