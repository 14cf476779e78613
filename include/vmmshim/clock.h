/* The shim's one clock (clock.c): CLOCK_MONOTONIC nanoseconds, and a cheaper raw reading
 * for the trace's hot path that converts to the same nanoseconds later.
 *
 * Raw readings come from the CPU's time-stamp counter where it ticks at a constant rate on
 * every core (Linux's constant_tsc and nonstop_tsc flags): a few ns, a third of
 * clock_gettime. Elsewhere a raw reading is clock_gettime's nanoseconds. */
#ifndef VMMSHIM_CLOCK_H
#define VMMSHIM_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

/* CLOCK_MONOTONIC in ns (vDSO: no system call). */
static inline uint64_t _vs_clock_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

extern bool _vs_clock_tsc; /* raw readings are TSC ticks (set by _vs_clock_open) */

static inline uint64_t _vs_clock_raw(void) {
#if defined(__x86_64__)
  if (__builtin_expect(_vs_clock_tsc, 1)) return __rdtsc();
#endif
  return _vs_clock_mono_ns();
}

/* Measures the counter's rate (about 1 ms) and starts the first clock segment. */
void _vs_clock_open(void);
/* Starts a new segment at the rate measured over the whole time since _vs_clock_open. */
void _vs_clock_calibrate(void);
/* A raw reading in CLOCK_MONOTONIC ns. Readings older than the oldest kept segment extend it
 * backwards. _vs_clock_open, _vs_clock_calibrate and this are serialised by the caller (the
 * trace's drain lock). */
uint64_t _vs_clock_to_ns(uint64_t raw);

#endif
