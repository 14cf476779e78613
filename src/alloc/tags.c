/* tags.c: the names allocations are grouped by, so that a group can sleep and wake.
 *
 * A tag is an index into a small table of names. 0 is "untagged", the memory of a program that
 * set no tag: it is not "default", the tag a region takes when it names none, so that a pause of
 * regions never takes memory allocated outside them (docs/sleep.md). A thread's allocations go to
 * its own tag when it set one (vmmshim_set_tag, a scope in Python), else to the process's
 * (VMMSHIM_TAG at start, vmmshim_set_process_tag, or vmmshim ctl from outside). Reading the
 * current tag costs one thread-local load, and one relaxed atomic load when the thread set
 * none: the allocation path asks for it every time. Tags are never removed (there are at most
 * VMMSHIM_MAX_TAGS), so an index stays valid for the life of the process. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "vmmshim/alloc.h"

static char vs_tag_names[VS_MAX_TAGS][VMMSHIM_TAG_MAX] = {"untagged"};
static atomic_int vs_ntags = 1;
static atomic_bool vs_tag_keep[VS_MAX_TAGS];
atomic_int _vs_process_tag;
_Thread_local int _vs_tl_tag1;
static vs_lock_t vs_tags_lock = VS_LOCK_INITIALIZER(VS_RANK_TAGS, "tags");
static pthread_once_t vs_tags_once = PTHREAD_ONCE_INIT;

bool _vs_tag_name_ok(const char *name) { return _vs_name_ok(name); }

/* VMMSHIM_TAG: the process's tag from the start. The options may not be read yet (a program that
 * asks for its tags before its first CUDA call): they are read here then. */
static void tags_init(void) {
  _vs_config_init();
  const char *t = _vs_option_string(VS_OPT_TAG);
  if (!t) return;
  int id = _vs_tag_find(t, true);
  if (id >= 0) atomic_store(&_vs_process_tag, id);
  else
    _vs_warn("VMMSHIM_TAG='%s' is not a tag name (1-31 of A-Z a-z 0-9 _ . -); using the default, \"untagged\"", t);
}

void _vs_tags_init(void) { pthread_once(&vs_tags_once, tags_init); }

int _vs_tag_find(const char *name, bool create) {
  if (!_vs_tag_name_ok(name)) return -EINVAL;
  int n = atomic_load_explicit(&vs_ntags, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (!strcmp(vs_tag_names[i], name)) return i;
  if (!create) return -ENOENT;
  _vs_lock_take(&vs_tags_lock);
  n = atomic_load(&vs_ntags);
  int id = -ENOSPC;
  for (int i = 0; i < n && id < 0; i++)
    if (!strcmp(vs_tag_names[i], name)) id = i;
  if (id < 0 && n < VS_MAX_TAGS) {
    strcpy(vs_tag_names[n], name);
    atomic_store_explicit(&vs_ntags, n + 1, memory_order_release);
    id = n;
  }
  _vs_lock_release(&vs_tags_lock);
  static atomic_bool said;
  if (id == -ENOSPC && !atomic_exchange(&said, true))
    _vs_warn("more than %d tags: '%s' refused (and any other new tag from now on)", VS_MAX_TAGS, name);
  return id;
}

const char *_vs_tag_name(int id) { return id >= 0 && id < atomic_load(&vs_ntags) ? vs_tag_names[id] : "?"; }
int _vs_tag_count(void) { return atomic_load_explicit(&vs_ntags, memory_order_acquire); }
bool _vs_tag_keep(int id) { return id >= 0 && id < VS_MAX_TAGS && atomic_load(&vs_tag_keep[id]); }

int _vs_set_thread_tag(const char *tag) {
  if (!tag) {
    _vs_tl_tag1 = 0;
    return 0;
  }
  _vs_tags_init();
  int id = _vs_tag_find(tag, true);
  if (id < 0) return id;
  _vs_tl_tag1 = id + 1;
  return 0;
}

int _vs_set_process_tag(const char *tag) {
  _vs_tags_init();
  int id = _vs_tag_find(tag, true);
  if (id < 0) return id;
  atomic_store(&_vs_process_tag, id);
  _vs_info("new allocations of threads without a tag of their own go to tag '%s'", tag);
  return 0;
}

int _vs_get_tag(char *buf, size_t n) {
  _vs_tags_init();
  const char *name = _vs_tag_name(_vs_current_tag());
  if (strlen(name) >= n) return -EINVAL;
  strcpy(buf, name);
  return 0;
}

int _vs_set_tag_keep(const char *tag, bool keep) {
  _vs_tags_init();
  int id = _vs_tag_find(tag, true);
  if (id < 0) return id;
  atomic_store(&vs_tag_keep[id], keep);
  return 0;
}
