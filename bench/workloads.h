/* Irregular allocation workloads shared by the GPU benchmarks (bench/churn.cu) and their CPU
 * counterparts on the host emulation (bench/cpu_frag.c): the same seeded generator, so both
 * see the same sequence of sizes. C and CUDA C++.
 *
 * churn: a window of 256 live buffers; each step frees one chosen at random and allocates a
 *   new one in its place. Sizes are log-uniform within three classes: 70% 256 B - 1 MiB, 25%
 *   1 - 64 MiB, 5% 64 - 512 MiB (a mixed inference server, a data pipeline).
 * varlen: a transformer's training step at a variable sequence length. Long-lived parameters
 *   and optimizer state (allocated once), then per step: for each of 12 layers, activations of
 *   batch x seq x d_model (4 of them), batch x heads x seq x seq attention scores, and an MLP
 *   activation 4x wider, all kept until the backward pass frees them in reverse order, with
 *   short-lived temporaries in between; seq drawn from 64 .. 2048 each step, rounded to 8. */
#ifndef VMMSHIM_BENCH_WORKLOADS_H
#define VMMSHIM_BENCH_WORKLOADS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct wl_rng_s {
  uint64_t s;
} wl_rng_t;

static inline uint64_t wl_next(wl_rng_t *r) { /* xorshift64* */
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1Dull;
}

static inline double wl_unit(wl_rng_t *r) { return (double)(wl_next(r) >> 11) * (1.0 / 9007199254740992.0); }

static inline size_t wl_log_uniform(wl_rng_t *r, double lo, double hi) {
  return (size_t)exp(log(lo) + wl_unit(r) * (log(hi) - log(lo)));
}

/* One event: op 'a' allocates `size` bytes as object `id`; 'f' frees object `id`. */
typedef struct wl_event_s {
  char op;
  unsigned id;
  size_t size;
} wl_event_t;

/* A trace in bench/replay.cu's format ("a <id> <size>", "f <id>", other lines skipped), read
 * whole: its events (malloc'd, *n_out of them), or NULL when the file cannot be opened (errno
 * says why) or memory runs out. */
static inline wl_event_t *wl_read_trace(const char *path, size_t *n_out) {
  *n_out = 0;
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  wl_event_t *ev = (wl_event_t *)malloc(cap * sizeof *ev);
  char line[256];
  while (ev && fgets(line, sizeof line, f)) {
    unsigned id;
    unsigned long long sz;
    if (n == cap) {
      wl_event_t *more = (wl_event_t *)realloc(ev, (cap *= 2) * sizeof *ev);
      if (!more) free(ev);
      ev = more;
      if (!ev) break;
    }
    if (sscanf(line, "a %u %llu", &id, &sz) == 2) ev[n++] = (wl_event_t){'a', id, (size_t)sz};
    else if (sscanf(line, "f %u", &id) == 1) ev[n++] = (wl_event_t){'f', id, 0};
  }
  fclose(f);
  *n_out = ev ? n : 0;
  return ev;
}

/* ---- churn ---- */
#define WL_CHURN_WINDOW 256

static inline size_t wl_churn_size(wl_rng_t *r) {
  double u = wl_unit(r);
  if (u < 0.70) return wl_log_uniform(r, 256.0, 1048576.0);
  if (u < 0.95) return wl_log_uniform(r, 1048576.0, 67108864.0);
  return wl_log_uniform(r, 67108864.0, 536870912.0);
}

/* The events of `steps` churn steps after the window is filled (WL_CHURN_WINDOW allocations):
 * WL_CHURN_WINDOW + 2 * steps events written to out (which must have room), returned. Object
 * ids count up from 0; slot[] maps the window's slots to ids (caller's array of WINDOW). */
static inline size_t wl_churn(uint64_t seed, unsigned steps, wl_event_t *out) {
  wl_rng_t r = {seed * 0x9E3779B97F4A7C15ull + 1};
  unsigned slot[WL_CHURN_WINDOW];
  size_t n = 0;
  unsigned next_id = 0;
  for (unsigned i = 0; i < WL_CHURN_WINDOW; i++) {
    slot[i] = next_id++;
    out[n++] = (wl_event_t){'a', slot[i], wl_churn_size(&r)};
  }
  for (unsigned s = 0; s < steps; s++) {
    unsigned k = (unsigned)(wl_next(&r) % WL_CHURN_WINDOW);
    out[n++] = (wl_event_t){'f', slot[k], 0};
    slot[k] = next_id++;
    out[n++] = (wl_event_t){'a', slot[k], wl_churn_size(&r)};
  }
  return n;
}

/* ---- varlen ---- */
#define WL_VARLEN_LAYERS 12
#define WL_VARLEN_BATCH 8
#define WL_VARLEN_DMODEL 1024
#define WL_VARLEN_HEADS 16
/* Events of one step at most (upper bound for the caller's buffer). */
#define WL_VARLEN_STEP_EVENTS (WL_VARLEN_LAYERS * 18)
#define WL_VARLEN_PARAM_EVENTS (WL_VARLEN_LAYERS * 6 + 4)

/* Parameters and optimizer state (fp32, three copies: weights, two Adam moments) and, per
 * step, the activations of a forward and backward pass at a random sequence length. Returns
 * the number of events written to out (room: WL_VARLEN_PARAM_EVENTS + steps *
 * WL_VARLEN_STEP_EVENTS). */
static inline size_t wl_varlen(uint64_t seed, unsigned steps, wl_event_t *out) {
  wl_rng_t r = {seed * 0x9E3779B97F4A7C15ull + 7};
  size_t n = 0;
  unsigned id = 0;
  const size_t d = WL_VARLEN_DMODEL, b = WL_VARLEN_BATCH, h = WL_VARLEN_HEADS, f32 = 4, f16 = 2;
  for (int l = 0; l < WL_VARLEN_LAYERS; l++)
    for (int k = 0; k < 3; k++) { /* weights, exp_avg, exp_avg_sq of attention and MLP */
      out[n++] = (wl_event_t){'a', id++, 4 * d * d * f32};
      out[n++] = (wl_event_t){'a', id++, 8 * d * d * f32};
    }
  unsigned saved[WL_VARLEN_LAYERS * 8];
  for (unsigned s = 0; s < steps; s++) {
    size_t seq = (64 + (size_t)(wl_next(&r) % (2048 - 64 + 1))) & ~(size_t)7;
    unsigned ns = 0;
    for (int l = 0; l < WL_VARLEN_LAYERS; l++) {
      size_t act = b * seq * d * f16;
      for (int k = 0; k < 4; k++) { /* q, k, v, attention output: kept for backward */
        saved[ns] = id++;
        out[n++] = (wl_event_t){'a', saved[ns++], act};
      }
      saved[ns] = id++; /* softmax of the scores: kept */
      out[n++] = (wl_event_t){'a', saved[ns++], b * h * seq * seq * f16};
      unsigned tmp = id++; /* the raw scores: freed after the softmax */
      out[n++] = (wl_event_t){'a', tmp, b * h * seq * seq * f16};
      out[n++] = (wl_event_t){'f', tmp, 0};
      saved[ns] = id++; /* MLP hidden activation, 4x wider: kept */
      out[n++] = (wl_event_t){'a', saved[ns++], 4 * act};
      unsigned t2 = id++; /* a layer-norm temporary */
      out[n++] = (wl_event_t){'a', t2, act + 4096};
      out[n++] = (wl_event_t){'f', t2, 0};
    }
    /* backward: gradients appear and the saved activations go, last layer first */
    for (int l = WL_VARLEN_LAYERS - 1; l >= 0; l--) {
      unsigned g = id++;
      out[n++] = (wl_event_t){'a', g, b * seq * d * f16 * 4};
      for (int k = 0; k < 6; k++) out[n++] = (wl_event_t){'f', saved[--ns], 0};
      out[n++] = (wl_event_t){'f', g, 0};
    }
  }
  return n;
}

#endif
