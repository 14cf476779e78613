"""vmmshim from Python: tags, sleep and wake in this process, and control of another.

In a process that runs under the shim (`vmmshim python train.py`, or LD_PRELOAD=libvmmshim.so),
the functions below call the preloaded library through ctypes (no build step). They mirror
torch_memory_saver, so code written for it can switch:

    import vmmshim
    with vmmshim.region("weights", enable_cpu_backup=True):
        model = make_model().cuda()          # its allocations go to tag "weights"
    with vmmshim.region("kv"):
        cache = torch.empty(..., device="cuda")
    vmmshim.pause("kv")        # discard: no CPU backup was asked for
    vmmshim.pause("weights")   # host: the bytes are copied to host memory
    ...                        # another program uses the GPU
    vmmshim.resume()           # every paused tag, at the same addresses

A tag's memory sleeps only if it was allocated while the tag was set: with PyTorch's caching
allocator, blocks cached before the region was entered keep the tag they were first made under.
Memory allocated with no tag set is tag "untagged", never "default" (region()'s tag): pause() and
resume() with no tag take every tag a region used, never "untagged" (docs/sleep.md, "Untagged
memory"). Programs written for torch_memory_saver: vmmshim.torch_memory_saver.
Without the shim, every function that calls it (region, pause and resume included) raises
NotPreloaded, with one line saying how to run under it. Reference: docs/sleep.md, "From Python".

vmmshim.control(pid) steers another process under the shim from this one, with the verbs of
`vmmshim ctl` (vmmshim/client.py); it does not need the shim in this process.
vmmshim.control_group(name) sleeps and wakes every member of a group together, all or nothing."""
import contextlib
import ctypes
import errno
import os
import threading

from .client import Control, ControlError, reachable  # noqa: F401  (the public API)

__all__ = ["region", "pause", "resume", "set_tag", "get_tag", "set_process_tag", "set_tag_keep", "sleep", "wake",
           "sleep_level", "promote", "tag_stats", "host_memory", "release_host", "host_copy", "host_view", "set_disk_dir", "stats", "trim", "dump",
           "control", "control_group", "reachable", "loaded", "library_path", "UNTAGGED", "SleepResult", "Error", "NotPreloaded",
           "ControlError", "Control", "set_tag_rules", "residue"]

TAG_MAX = 32
UNTAGGED = "untagged"  # the tag of memory allocated with no tag set
MAX_TAGS = 16
MODES = {"discard": 0, "host": 1, "mapped": 2, "disk": 3}
__version__ = "0.1.0"  # a copy of VMMSHIM_VERSION of include/vmmshim.h (test_docs_code.py checks)
API_VERSION = 6  # the library's VMMSHIM_API_VERSION this module was written for (at least)


# What NotPreloaded says when the library is not in the process: one line, how to get it there.
NOT_PRELOADED = "vmmshim: the shim is not preloaded: run under `vmmshim` or LD_PRELOAD=.../libvmmshim.so"


class NotPreloaded(RuntimeError):
    """The shim is not in this process (or is older than this module): raised by every function
    that calls it, region(), pause() and resume() included, with one line saying how to run under
    it. control() and reachable() do not need the shim here and never raise it."""


class Error(RuntimeError):
    """A call the shim refused: errno (positive), reason, and the result (SleepResult or None)."""

    def __init__(self, what, code, reason, result=None):
        RuntimeError.__init__(self, "vmmshim: %s: %s: %s" % (what, errno.errorcode.get(code, str(code)), reason))
        self.errno = code
        self.reason = reason
        self.result = result


class _SleepResult(ctypes.Structure):
    _fields_ = [("released", ctypes.c_uint64), ("restored", ctypes.c_uint64), ("to_host", ctypes.c_uint64),
                ("host_mapped", ctypes.c_uint64), ("discarded", ctypes.c_uint64), ("skipped", ctypes.c_uint64),
                ("ns", ctypes.c_uint64), ("error", ctypes.c_int), ("reason", ctypes.c_char * 160)]


class _TagStats(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * TAG_MAX), ("live", ctypes.c_uint64), ("device", ctypes.c_uint64),
                ("host_copied", ctypes.c_uint64), ("host_mapped", ctypes.c_uint64), ("discarded", ctypes.c_uint64),
                ("asleep", ctypes.c_int), ("keep", ctypes.c_int), ("disk", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _fields_ = [("allocs", ctypes.c_uint64 * 4), ("frees", ctypes.c_uint64 * 4)] + [
        (n, ctypes.c_uint64) for n in ("alloc_failures", "passthrough_allocs", "bytes_in_use", "peak_bytes_in_use",
                                       "bytes_requested_in_use", "bytes_mapped", "peak_bytes_mapped", "vmm_calls",
                                       "vmm_ns", "syncs", "trims", "pools")]


class SleepResult:
    """What a sleep or wake moved, in bytes; `seconds` it took; `error` (0, or -EALREADY when
    there was nothing to do) and `reason`."""

    def __init__(self, r):
        for name in ("released", "restored", "to_host", "host_mapped", "discarded", "skipped"):
            setattr(self, name, int(getattr(r, name)))
        self.seconds = r.ns / 1e9
        self.error = int(r.error)
        self.reason = r.reason.decode("utf-8", "replace")

    def __repr__(self):
        return "SleepResult(%s)" % ", ".join("%s=%r" % kv for kv in sorted(vars(self).items()))


_lib = None
_lock = threading.Lock()


def _shim():
    """The preloaded library's functions (found in the process's global symbols)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(None)
            try:
                version = lib.vmmshim_api_version
            except AttributeError:
                # from None: the ctypes lookup that failed says nothing the message does not.
                raise NotPreloaded(NOT_PRELOADED) from None
            version.restype = ctypes.c_int
            if version() < API_VERSION:
                raise NotPreloaded("vmmshim: the preloaded shim has API %d; this module needs %d or later"
                                   % (version(), API_VERSION))
            sigs = {
                "vmmshim_set_tag": (ctypes.c_int, [ctypes.c_char_p]),
                "vmmshim_set_process_tag": (ctypes.c_int, [ctypes.c_char_p]),
                "vmmshim_get_tag": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]),
                "vmmshim_set_tag_keep": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
                "vmmshim_sleep": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(_SleepResult),
                                                 ctypes.c_size_t]),
                "vmmshim_wake": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint, ctypes.POINTER(_SleepResult),
                                                ctypes.c_size_t]),
                "vmmshim_promote": (ctypes.c_int, [ctypes.POINTER(_SleepResult), ctypes.c_size_t]),
                "vmmshim_sleep_level": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_SleepResult),
                                                       ctypes.c_size_t]),
                "vmmshim_tag_stats": (ctypes.c_int, [ctypes.POINTER(_TagStats), ctypes.c_int, ctypes.c_size_t]),
                "vmmshim_host_memory": (ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64),
                                                       ctypes.POINTER(ctypes.c_uint64)]),
                "vmmshim_release_host": (ctypes.c_size_t, [ctypes.c_size_t]),
                "vmmshim_get_stats": (ctypes.c_int, [ctypes.POINTER(_Stats), ctypes.c_size_t]),
                "vmmshim_trim": (ctypes.c_size_t, []),
                "vmmshim_dump": (ctypes.c_int, []),
                "vmmshim_set_disk_dir": (ctypes.c_int, [ctypes.c_char_p]),
            }
            if version() >= 4:
                sigs["vmmshim_host_copy"] = (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                                            ctypes.POINTER(ctypes.c_size_t)])
            if version() >= 5:
                sigs["vmmshim_set_tag_rules"] = (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t])
            if version() >= 6:
                sigs["vmmshim_host_view"] = (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t,
                                                            ctypes.POINTER(ctypes.c_void_p)])
            for name, (res, args) in sigs.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            _lib = lib
    return _lib


def _name(tag):
    if tag is None:
        return None
    b = tag.encode() if isinstance(tag, str) else bytes(tag)
    if not b or len(b) >= TAG_MAX:
        raise ValueError("vmmshim: '%s' is not a tag name (1-31 of A-Z a-z 0-9 _ . -)" % tag)
    return b


def _check(rc, what, result=None):
    if rc < 0:
        reason = result.reason if result is not None and result.reason else os.strerror(-rc)
        raise Error(what, -rc, reason, result)
    return rc


# ---------------------------------------------------------------- tags

_thread = threading.local()  # the tag this module set for the thread (None: none)


def set_tag(tag):
    """The calling thread's allocations go to tag from now on (None: back to the process's)."""
    _check(_shim().vmmshim_set_tag(_name(tag)), "set_tag %s" % tag)
    _thread.tag = tag


def get_tag():
    """The tag the calling thread's next allocation goes to."""
    buf = ctypes.create_string_buffer(TAG_MAX)
    _check(_shim().vmmshim_get_tag(buf, TAG_MAX), "get_tag")
    return buf.value.decode()


def set_process_tag(tag):
    """Allocations of threads that set no tag of their own go to tag from now on."""
    _check(_shim().vmmshim_set_process_tag(_name(tag)), "set_process_tag %s" % tag)


def set_tag_keep(tag, keep=True):
    """A tag marked keep is copied to host memory, not discarded, by a level-2 sleep."""
    _check(_shim().vmmshim_set_tag_keep(_name(tag), 1 if keep else 0), "set_tag_keep %s" % tag)


def set_tag_rules(spec):
    """Replaces the tag rules (VMMSHIM_TAG_RULES, docs/tag-rules.md), e.g.
    "weights=phase:before-launch;kv=py:*/kv_cache.py"; None or "" clears them. A malformed spec
    raises Error (EINVAL) naming the rule and the character; the rules in force then stay."""
    lib = _shim()
    if lib.vmmshim_api_version() < 5:
        raise NotPreloaded("vmmshim: the preloaded shim has no vmmshim_set_tag_rules (API 5)")
    err = ctypes.create_string_buffer(256)
    rc = lib.vmmshim_set_tag_rules(spec.encode() if spec else None, err, len(err))
    if rc < 0:
        raise Error("set_tag_rules", -rc, err.value.decode(errors="replace") or os.strerror(-rc))


_backup = {}  # tag -> enable_cpu_backup, for the tags region() has seen (pause/resume without a tag)


@contextlib.contextmanager
def region(tag="default", enable_cpu_backup=False):
    """Allocations made in the with block by this thread go to tag; the thread's tag before it is
    back at the end. enable_cpu_backup: pause() keeps the tag's bytes (host mode) rather than
    discarding them."""
    _name(tag)
    _shim()  # NotPreloaded on entering the with block, before the tag is remembered for pause()
    _backup[tag] = bool(enable_cpu_backup) or _backup.get(tag, False)
    before = getattr(_thread, "tag", None)
    set_tag(tag)
    try:
        yield
    finally:
        set_tag(before)


def pause(tag=None):
    """Gives the device memory of tag back (every tag region() has seen, when None: never
    "untagged", the memory allocated outside regions, unless a region named it): its bytes
    are copied to host memory when the region was made with enable_cpu_backup, else discarded.
    Pausing a paused tag does nothing."""
    _shim()  # NotPreloaded even when there is no tag to pause: silence would hide the mistake
    for t in ([tag] if tag is not None else sorted(_backup)):
        sleep(t, "host" if _backup.get(t) else "discard")


def resume(tag=None):
    """Maps device memory at the same addresses again (every tag region() has seen, when None)."""
    _shim()
    for t in ([tag] if tag is not None else sorted(_backup)):
        wake(t)


# ---------------------------------------------------------------- sleep and wake

def _moved(what, call, *args):
    """Calls the shim's call(*args, result, size); returns the SleepResult, raises Error when it
    refused (nothing to do, -EALREADY, is not an error)."""
    r = _SleepResult()
    rc = call(*args, ctypes.byref(r), ctypes.sizeof(r))
    res = SleepResult(r)
    if rc == -errno.ENOENT and args and isinstance(args[0], bytes):
        # The shim's only ENOENT here is a tag it does not know; its reason, the errno's text,
        # names no tag.
        raise Error(what, errno.ENOENT, "no such tag: %s" % args[0].decode(errors="replace"), res)
    if rc != -errno.EALREADY:
        _check(rc, what, res)
    return res


def sleep(tag=None, mode="host"):
    """Sleeps tag (None: every tag, "untagged" included: the whole process) in mode "discard",
    "host", "mapped" or "disk" (docs/sleep.md). Returns a SleepResult; raises Error when the shim refused
    (EBUSY: a stream capture in progress, ENOENT: no such tag, ...). Nothing to do (asleep
    already) is not an error: result.error is -EALREADY."""
    if mode not in MODES:
        raise ValueError("vmmshim: mode '%s': discard, host, mapped or disk" % mode)
    return _moved("sleep %s" % (tag or "(every tag)"), _shim().vmmshim_sleep, _name(tag), MODES[mode])


def wake(tag=None, zero=False):
    """Wakes tag (None: every tag); zero: discarded bytes come back as zeros. When the device has
    no room, Error ENOMEM and nothing is lost (the tag stays asleep; try again later)."""
    return _moved("wake %s" % (tag or "(every tag)"), _shim().vmmshim_wake, _name(tag), 1 if zero else 0)


def promote():
    """Moves memory that runs on host memory past a limit (VMMSHIM_ON_LIMIT=host) back to the
    device, as far as the limit allows now. Error ENOMEM when none fits."""
    return _moved("promote", _shim().vmmshim_promote)


def sleep_level(level, mapped=False):
    """The whole process: 0 gives back idle memory only, 1 every tag to host memory (mapped
    mode when mapped), 2 discards every tag but those marked keep."""
    return _moved("sleep level %d" % level, _shim().vmmshim_sleep_level, int(level), 1 if mapped else 0)


# ---------------------------------------------------------------- figures

def tag_stats():
    """{tag: {"live", "device", "host_copied", "host_mapped", "discarded", "disk" (bytes), "asleep",
    "keep"}} for every tag of the process."""
    arr = (_TagStats * MAX_TAGS)()
    n = _check(_shim().vmmshim_tag_stats(arr, MAX_TAGS, ctypes.sizeof(_TagStats)), "tag_stats")
    out = {}
    for t in arr[:min(n, MAX_TAGS)]:
        out[t.name.decode()] = {"live": t.live, "device": t.device, "host_copied": t.host_copied,
                                "host_mapped": t.host_mapped, "discarded": t.discarded, "asleep": bool(t.asleep),
                                "keep": bool(t.keep), "disk": t.disk}
    return out


def residue():
    """What is still on each device and who owns it (docs/sleep.md, "Residue"): a dict with
    "devices" (used, total, free, "owners": tags, libraries, managed, graphs, context,
    other_processes, unexplained; growth since the first sleep), "libraries", "sites",
    "host_pinned", "sleeps" and "note". Needs a shim of API version 5 or later."""
    from . import residue_info as _residue
    try:
        return _residue.residue(_shim())
    except AttributeError as e:
        raise NotPreloaded("vmmshim: %s" % e) from None
    except OSError as e:
        raise Error("residue", e.errno, e.strerror) from None


def host_memory():
    """(in use, kept for the next sleep): bytes of host memory the shim holds."""
    in_use, cached = ctypes.c_uint64(), ctypes.c_uint64()
    _shim().vmmshim_host_memory(ctypes.byref(in_use), ctypes.byref(cached))
    return in_use.value, cached.value


def release_host(keep=0):
    """Gives kept host memory back down to keep bytes; returns the bytes given back."""
    return int(_shim().vmmshim_release_host(int(keep)))


def set_disk_dir(path):
    """The directory of the files of disk-mode sleeps made from now on (vmmshim_set_disk_dir;
    VMMSHIM_DISK_DIR at start, else $TMPDIR, else /tmp). Creates nothing: ValueError unless path
    is a writable directory."""
    lib = _shim()
    rc = lib.vmmshim_set_disk_dir(os.fsencode(os.fspath(path)))
    if rc < 0:
        raise ValueError("vmmshim: disk directory %r: %s" % (os.fspath(path), os.strerror(-rc)))


def host_copy(addr):
    """Where the bytes at device address addr are kept while its memory sleeps in host or mapped
    mode: (home, length), home a device address in a host buffer (the device reads it; copy from
    it with cuMemcpyDtoH), length the bytes that follow it there. None when addr is awake,
    discarded, or not the shim's."""
    lib = _shim()
    if lib.vmmshim_api_version() < 4:
        raise NotPreloaded("vmmshim: the preloaded shim has no vmmshim_host_copy (API 4)")
    home, n = ctypes.c_void_p(), ctypes.c_size_t()
    rc = lib.vmmshim_host_copy(ctypes.c_void_p(int(addr)), ctypes.byref(home), ctypes.byref(n))
    if rc == -errno.ENOENT:
        return None
    _check(rc, "host_copy 0x%x" % int(addr))
    return home.value, n.value


def host_view(addr, size):
    """The CPU address of the size bytes at device address addr while its memory sleeps in host or
    mapped mode: the shim's host buffer itself, no copy (vmmshim_host_view), valid until the memory
    wakes. None when addr is awake or not the shim's. Error with errno EXDEV when the bytes were
    discarded, are on disk or lie in two host buffers (64 MiB each), ENOTSUP when the driver
    refused the CPU access to host buffers (or the shim predates API 6)."""
    lib = _shim()
    if lib.vmmshim_api_version() < 6:
        raise Error("host_view", errno.ENOTSUP, "the preloaded shim has no vmmshim_host_view (API 6)")
    host = ctypes.c_void_p()
    rc = lib.vmmshim_host_view(ctypes.c_void_p(int(addr)), ctypes.c_size_t(int(size)), ctypes.byref(host))
    if rc == -errno.ENOENT:
        return None
    _check(rc, "host_view 0x%x, %d bytes" % (int(addr), int(size)))
    return host.value


def loaded():
    """True when the shim is in this process (preloaded, with an API this module knows)."""
    try:
        _shim()
        return True
    except NotPreloaded:
        return False


def library_path():
    """The path of libvmmshim.so: the one loaded in this process, else the one installed with this
    package, else $VMMSHIM_LIB, else the checkout's build/ (None when none is there)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if path.endswith("/libvmmshim.so"):
                    return path
    except OSError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "lib", "libvmmshim.so"), os.environ.get("VMMSHIM_LIB") or "",
                 os.path.join(here, "..", "..", "..", "build", "libvmmshim.so")):
        if cand and os.path.isfile(cand):
            return os.path.realpath(cand)
    return None


def stats():
    """The process's counters (vmmshim_get_stats), as a dict."""
    st = _Stats()
    _check(_shim().vmmshim_get_stats(ctypes.byref(st), ctypes.sizeof(st)), "stats")
    out = {name: getattr(st, name) for name, _ in _Stats._fields_}
    out["allocs"], out["frees"] = list(st.allocs), list(st.frees)
    return out


def trim():
    """Gives idle device memory back; returns the bytes."""
    return int(_shim().vmmshim_trim())


def dump():
    """Writes the memory report to the shim's log."""
    _check(_shim().vmmshim_dump(), "dump")


# ---------------------------------------------------------------- another process

def control(pid, timeout=10.0, move_timeout=300.0):
    """The process pid under the shim, steered from here: an object with the verbs of `vmmshim
    ctl` (status, tag, sleep, wake, trim, limit, dump, release_host)."""
    return Control(pid, timeout, move_timeout)


def control_group(name, timeout=60.0):
    """The live members of group name (VMMSHIM_LIMIT_GROUP), steered together: sleep(tag=None,
    mode=None, level=None) and wake(tag=None, zero=False) on every member, all or nothing, each
    returning what happened per member (docs/control.md, "A whole group"); status()."""
    from .group_sleep import GroupControl
    return GroupControl(name, timeout)
