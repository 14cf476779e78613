/* disk.c: disk mode, a pool's sleeping bytes in a file (the file itself: handle/disk.c).
 *
 * A sleep copies each segment, in pieces of VS_DISK_PIECE, from the device into one of the two
 * pinned staging buffers (host.c) and writes it to the pool's file while the next piece copies
 * into the other: the link and the disk work at once. Device memory goes only after the last
 * byte is written and synced (sleep.c): a write that fails (ENOSPC, EIO, a short write) leaves
 * every segment on the device and the file as it was; the file's blocks are allocated for the
 * whole sleep before the first write (together on the disk, and no allocation per write). A
 * wake keeps up to VS_DISK_BUFS reads of VS_DISK_PIECE in flight, one per staging buffer, and
 * copies each piece to the device once it is read, while the later ones are read: the disk
 * always has the next reads queued. A read that fails leaves the segments it was for asleep,
 * with their file, for a later wake.
 *
 * Only sleeps and wakes touch p->disk, one at a time (the alloc layer's lock). The pool lock is
 * not held here: every call is a driver call or a file operation. */
#include <errno.h>
#include <stdlib.h>

#include "vmmshim/pool_internal.h"

typedef struct vs_out_slot_s {
  bool busy;
  size_t len;
  uint64_t at; /* file offset */
  vs_copy_mark_t mark;
} vs_out_slot_t;

/* The piece in slot s: waits for its copy into buf, then writes it. 0 or -errno. */
static int write_slot(vs_disk_t *d, vs_copier_t *cp, void *buf, vs_out_slot_t *s, vs_move_t *out) {
  s->busy = false;
  CUresult w = _vs_copier_wait(cp, &s->mark);
  if (w != CUDA_SUCCESS) {
    move_note(out, w, "copying to the staging buffers failed");
    return -EIO;
  }
  int e = _vs_disk_write(d, buf, s->len, s->at);
  disk_note(out, e, "writing the sleep file failed");
  return e;
}

/* Every segment's bytes through two of the staging buffers: piece k copies into buf[k % 2] while
 * piece k - 1 is written (a write returns when its bytes are on the disk, so one copy ahead is
 * enough). 0 or -errno; every mark is waited for either way. */
static int pump_out(vs_disk_t *d, vs_copier_t *cp, void *buf[VS_DISK_BUFS], const vs_seg_t *segs, int n, uint64_t *offs,
                    vs_move_t *out) {
  vs_out_slot_t slot[2] = {{0}};
  uint64_t at = d->len;
  unsigned k = 0;
  int e = 0;
  for (int i = 0; i < n && !e; i++) {
    offs[i] = at;
    for (size_t done = 0; done < segs[i].size && !e; k++) {
      size_t len = segs[i].size - done < VS_DISK_PIECE ? segs[i].size - done : VS_DISK_PIECE;
      vs_out_slot_t *s = &slot[k & 1];
      if (s->busy && (e = write_slot(d, cp, buf[k & 1], s, out)) != 0) break;
      _vs_copier_to_host(cp, buf[k & 1], segs[i].va + done, len);
      *s = (vs_out_slot_t){true, len, at, _vs_copier_mark(cp)};
      done += len;
      at += len;
    }
  }
  for (unsigned j = 0; j < 2; j++) { /* the older piece first */
    vs_out_slot_t *s = &slot[(k + j) & 1];
    if (!s->busy) continue;
    if (!e) {
      e = write_slot(d, cp, buf[(k + j) & 1], s, out);
    } else {
      _vs_copier_wait(cp, &s->mark);
      s->busy = false;
    }
  }
  return e;
}

/* The pool's file for a sleep: a new one, or the one its earlier disk sleep left (still holding
 * segments asleep), opened again. */
static int file_for_sleep(vs_pool_t *p, const char *tag, bool *fresh) {
  *fresh = !p->disk;
  if (p->disk) return _vs_disk_open(p->disk);
  p->disk = calloc(1, sizeof *p->disk);
  if (!p->disk) return -ENOMEM;
  int e = _vs_disk_create(p->disk, tag, (int)p->caps.device);
  if (e) {
    free(p->disk);
    p->disk = NULL;
  }
  return e;
}

bool _vs_disk_out(vs_pool_t *p, const char *tag, const vs_seg_t *segs, int n, uint64_t *offs, vs_move_t *out) {
  if (!n) return true;
  bool fresh;
  int e = file_for_sleep(p, tag, &fresh);
  if (e) {
    disk_note(out, e, "creating the sleep file failed");
    return false;
  }
  uint64_t start = p->disk->len, total = 0;
  for (int i = 0; i < n; i++) total += segs[i].size;
  void *buf[VS_DISK_BUFS];
  e = _vs_disk_preallocate(p->disk, start, total);
  disk_note(out, e, "allocating the sleep file's blocks failed");
  CUresult r = e ? CUDA_SUCCESS : _vs_host_staging_take(buf);
  if (!e && r != CUDA_SUCCESS) {
    move_note(out, r, "pinned staging memory for the disk could not be had");
    e = -ENOMEM;
  } else if (!e) {
    vs_copier_t cp;
    _vs_copier_open(&cp);
    e = pump_out(p->disk, &cp, buf, segs, n, offs, out);
    CUresult c = _vs_copier_close(&cp);
    _vs_host_staging_give();
    if (!e && c != CUDA_SUCCESS) {
      move_note(out, c, "copying to the staging buffers failed");
      e = -EIO;
    }
    if (!e) {
      e = _vs_disk_sync(p->disk);
      disk_note(out, e, "syncing the sleep file failed");
    }
  }
  if (!e) {
    _vs_disk_close(p->disk);
    return true;
  }
  if (fresh) {
    _vs_disk_remove(p->disk);
    free(p->disk);
    p->disk = NULL;
  } else {
    _vs_disk_truncate(p->disk, start); /* the segments asleep before keep their bytes */
    _vs_disk_close(p->disk);
  }
  return false;
}

int _vs_disk_in_start(vs_pool_t *p, vs_disk_in_t *in, vs_move_t *out) {
  *in = (vs_disk_in_t){0};
  int e = p->disk ? _vs_disk_open(p->disk) : -ENOENT;
  if (e) {
    disk_note(out, e, "opening the sleep file failed; it stays asleep");
    return e;
  }
  CUresult r = _vs_host_staging_take(in->buf);
  if (r != CUDA_SUCCESS) {
    _vs_disk_close(p->disk);
    move_note(out, r, "pinned staging memory for the disk could not be had; it stays asleep");
    return -ENOMEM;
  }
  _vs_disk_reads_open(&in->rd);
  in->open = true;
  return 0;
}

/* Waits for every read and copy of the staging buffers (after a failure: their results unused). */
static void drain(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp) {
  for (unsigned j = 0; j < VS_DISK_BUFS; j++) {
    unsigned b = (in->k + j) % VS_DISK_BUFS; /* the oldest first */
    if (in->slot[b].state == 1) _vs_disk_read_finish(p->disk, &in->rd, (int)b);
    if (in->slot[b].state == 2) _vs_copier_wait(cp, &in->slot[b].mark);
    in->slot[b].state = 0;
  }
}

/* Slot b's read is waited for and its piece queued to the device. 0 or -errno. */
static int land(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp, unsigned b, vs_move_t *out) {
  int e = _vs_disk_read_finish(p->disk, &in->rd, (int)b);
  in->slot[b].state = 0;
  if (e) {
    disk_note(out, e, "reading the sleep file failed; it stays asleep with its file");
    return e;
  }
  _vs_copier_from_host(cp, in->slot[b].va, in->buf[b], in->slot[b].len);
  in->slot[b].mark = _vs_copier_mark(cp);
  in->slot[b].state = 2;
  return 0;
}

/* Slot b made free: its read landed and its piece on the device. 0 or -errno. */
static int free_slot(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp, unsigned b, vs_move_t *out) {
  int e = in->slot[b].state == 1 ? land(p, in, cp, b, out) : 0;
  if (!e && in->slot[b].state == 2) {
    CUresult w = _vs_copier_wait(cp, &in->slot[b].mark);
    in->slot[b].state = 0;
    if (w != CUDA_SUCCESS) {
      move_note(out, w, "copying back to the device failed");
      e = -EIO;
    }
  }
  return e;
}

int _vs_disk_in_seg(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp, CUdeviceptr va, size_t size, uint64_t off,
                    vs_move_t *out) {
  for (size_t done = 0; done < size; in->k++) {
    size_t len = size - done < VS_DISK_PIECE ? size - done : VS_DISK_PIECE;
    unsigned b = in->k % VS_DISK_BUFS; /* the oldest slot: its piece was started VS_DISK_BUFS pieces ago */
    int e = free_slot(p, in, cp, b, out);
    if (e) {
      drain(p, in, cp);
      return e;
    }
    _vs_disk_read_start(p->disk, &in->rd, (int)b, in->buf[b], len, off + done);
    in->slot[b].va = va + done;
    in->slot[b].len = len;
    in->slot[b].state = 1;
    done += len;
  }
  return 0;
}

int _vs_disk_in_flush(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp, vs_move_t *out) {
  for (unsigned j = 0; j < VS_DISK_BUFS; j++) {
    unsigned b = (in->k + j) % VS_DISK_BUFS;
    int e = in->slot[b].state == 1 ? land(p, in, cp, b, out) : 0;
    if (e) {
      drain(p, in, cp);
      return e;
    }
  }
  return 0;
}

void _vs_disk_in_end(vs_pool_t *p, vs_disk_in_t *in, vs_copier_t *cp) {
  if (!in->open) return;
  drain(p, in, cp);
  _vs_disk_reads_close(&in->rd);
  _vs_host_staging_give();
  _vs_disk_close(p->disk);
  in->open = false;
}

void _vs_disk_forget(vs_pool_t *p, bool force) {
  if (!p->disk) return;
  bool used = false;
  pool_lock(p);
  for (size_t i = 0; i < p->asleep.n && !used; i++) used = p->asleep.v[i].mode == VMMSHIM_SLEEP_DISK;
  pool_unlock(p);
  if (used && !force) return;
  _vs_disk_remove(p->disk);
  free(p->disk);
  p->disk = NULL;
}
