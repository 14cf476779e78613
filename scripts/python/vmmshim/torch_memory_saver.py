"""torch_memory_saver's Python API, served by the shim: programs written for it run unchanged.

    from vmmshim.torch_memory_saver import torch_memory_saver
    with torch_memory_saver.region(tag="kv", enable_cpu_backup=True):
        cache = torch.empty(..., device="cuda")
    torch_memory_saver.pause("kv")      # host mode: the bytes go to host memory
    torch_memory_saver.resume("kv")     # same addresses, same bytes

`vmmshim --as torch_memory_saver python app.py` (or VMMSHIM_AS=torch_memory_saver under the
launcher) makes `import torch_memory_saver` resolve to this module. The process must run under
the shim; torch is imported only when a call needs it. Memory allocated outside every region is
tag "untagged" and never paused by pause() (docs/sleep.md, "Untagged memory"); where this module
differs from torch_memory_saver, docs/sleep.md's table says so."""
import contextlib
import ctypes
import errno
import os
import sys
import threading
import warnings
import weakref

from . import (UNTAGGED, Error, NotPreloaded, control, host_copy, host_view, library_path, loaded, release_host,
               set_disk_dir, set_tag, sleep, wake)
from . import _backup as _region_tags  # tag -> enable_cpu_backup, of every region() entered
from . import _thread
from . import region as _region

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]

_TAG_DEFAULT = "default"
_HOOK_MODES = ("preload", "torch")
_CPU_BACKENDS = ("pinned", "mmap")
_disk_tags = set()  # tags of every region() entered with enable_disk_backup: paused in disk mode


def _torch():
    """torch, when the program imported it (a program without it has no tensors to pool)."""
    return sys.modules.get("torch")


def _device_to_host(dst, src, n):
    """Copies n bytes from device address src (a host buffer's home mapping) to host memory at dst."""
    cuda = ctypes.CDLL("libcuda.so.1")
    fn = cuda.cuMemcpyDtoH_v2
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    rc = fn(ctypes.c_void_p(dst), ctypes.c_uint64(src), ctypes.c_size_t(n))
    if rc != 0:
        raise Error("get_cpu_backup: cuMemcpyDtoH", errno.EIO, "CUDA error %d" % rc)


def _backup_into(addr, nbytes, dst):
    """Copies the nbytes at device address addr, asleep with their bytes on the host, to host
    memory at dst. False (nothing copied) when any of them is awake or was discarded."""
    pieces, off = [], 0
    while off < nbytes:
        where = host_copy(addr + off)
        if where is None:
            return False
        home, n = where
        n = min(n, nbytes - off)
        pieces.append((off, home, n))
        off += n
    for off, home, n in pieces:
        _device_to_host(dst + off, home, n)
    return True


def _mem_get_info():
    """(free, total) bytes of the current device, as the program sees them."""
    torch = _torch()
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.mem_get_info()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    rc = ctypes.CDLL(None).cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    if rc != 0:
        raise Error("memory_margin_bytes: cudaMemGetInfo", errno.EIO, "CUDA error %d" % rc)
    return free.value, total.value


def _preload_env(env):
    """env with the shim first in LD_PRELOAD (once)."""
    lib = library_path()
    if lib is None:
        raise NotPreloaded("vmmshim: libvmmshim.so not found (set VMMSHIM_LIB)")
    env = dict(env)
    rest = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p and p != lib]
    env["LD_PRELOAD"] = ":".join([lib] + rest)
    env["VMMSHIM_LIB"] = lib
    return env


@contextlib.contextmanager
def configure_subprocess():
    """Child processes started in the with block run under the shim (LD_PRELOAD set in os.environ,
    restored at the end)."""
    before = {k: os.environ.get(k) for k in ("LD_PRELOAD", "VMMSHIM_LIB")}
    os.environ.update(_preload_env(os.environ))
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class TorchMemorySaver:
    """torch_memory_saver's TorchMemorySaver on the shim (one per process is enough:
    torch_memory_saver, below)."""

    def __init__(self):
        self._hook_mode = "preload"
        self._margin = 0
        self._retain = False
        self._pools = {}     # (kind, device) -> [torch.cuda.MemPool] that nothing routes into now
        self._retired = []   # disable()'s pools, dropped once none of this module's blocks routes
        self._underway = 0   # this module's with blocks (all threads) routing into a pool or capturing
        self._lock = threading.Lock()
        self._views = []     # weak references to the buffers under get_cpu_backup(zero_copy=True)'s tensors
        self._said_no_cpu = False

    # ------------------------------------------------------------ regions

    @staticmethod
    def _pooling():
        """torch, when PyTorch's caching allocator is there to route (None: no torch, no device,
        or no cache, where each tensor is a cudaMalloc of its own and nothing crosses regions)."""
        torch = _torch()
        if (torch is None or not hasattr(torch.cuda, "MemPool") or not torch.cuda.is_available()
                or os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"):
            return None
        return torch

    def _enter(self):
        with self._lock:
            self._underway += 1

    def _leave(self):
        """The end of a with block of _enter() or _routed(). PyTorch destroys a MemPool with an
        emptyCache that asserts that no use_mem_pool and no graph capture is under way in any
        thread (captures_underway.empty(): an abort), so the pools given up wait in _retired until
        none of ours is; the lock is held across the drop so that none begins meanwhile."""
        with self._lock:
            self._underway -= 1
            if not self._underway:
                self._retired.clear()

    @contextlib.contextmanager
    def _routed(self, kind, keep):
        """Allocations of this thread in the with block come from a pool of PyTorch's caching
        allocator of kind's own: blocks cached outside it never serve it, and its blocks never
        serve allocations outside it (their tags would be wrong: untagged memory paused, or a
        region's not). One pool takes one use_mem_pool at a time, all threads together
        (PyTorch: "already recording to mempool_id"), so a block nested in one of the same kind,
        or another thread's, gets another pool. keep: the pool is kept for the next block of
        kind (its cached blocks stay its tag's); else it is dropped, which gives its memory back
        to the device once its tensors are freed (torch.cuda.empty_cache())."""
        torch = self._pooling()
        if torch is None:
            yield
            return
        key = (kind, torch.cuda.current_device())
        with self._lock:
            idle = self._pools.setdefault(key, [])
            pool = idle.pop() if idle else torch.cuda.MemPool()
            self._underway += 1
        done = False
        try:
            with torch.cuda.use_mem_pool(pool):
                yield
            done = True
        finally:
            # After an exception, a traceback may hold the pool and drop it at any time: kept.
            with self._lock:
                (self._retired if done and not keep else self._pools[key]).append(pool)
            del pool  # _retired's is the last reference: _leave() drops it
            self._leave()

    @staticmethod
    def _check_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        if enable_disk_backup and enable_cpu_backup:
            raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
        if cpu_backup_backend is not None:
            if not enable_cpu_backup:
                raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
            if cpu_backup_backend not in _CPU_BACKENDS:
                raise ValueError("cpu_backup_backend: 'pinned' or 'mmap', not %r" % (cpu_backup_backend,))

    @contextlib.contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False, cpu_backup_backend=None):
        """Allocations of this thread in the with block go to tag; pause(tag) gives them back
        (their bytes kept in host memory when enable_cpu_backup, in a file when
        enable_disk_backup, else discarded)."""
        self._check_backup(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        if enable_disk_backup:
            _disk_tags.add(tag)
        with self._routed(("region", tag, bool(enable_cpu_backup)), True), \
                _region(tag, enable_cpu_backup=enable_cpu_backup):
            yield

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", tag=_TAG_DEFAULT,
                   enable_cpu_backup=False, cpu_backup_backend=None):
        """torch.cuda.graph(...) whose memory (the graph's pool) belongs to tag, and pauses with it."""
        self._check_backup(enable_cpu_backup, False, cpu_backup_backend)
        import torch
        self._enter()  # a capture is under way: no pool of ours may be dropped meanwhile
        try:
            with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
                with _region(tag, enable_cpu_backup=enable_cpu_backup):
                    yield
        finally:
            self._leave()

    @contextlib.contextmanager
    def disable(self):
        """Allocations of this thread in the with block are never paused (tag "untagged", in a
        pool of PyTorch's caching allocator that is given up at the end, or once the last
        region() or cuda_graph() under way in the process ends)."""
        before = getattr(_thread, "tag", None)
        with self._routed(("disable",), False):
            set_tag(UNTAGGED)  # not region(): "untagged" must not join the tags pause() takes
            try:
                yield
            finally:
                set_tag(before)

    # ------------------------------------------------------------ pause and resume

    @staticmethod
    def _tags(tag):
        return [tag] if tag is not None else sorted(t for t in _region_tags if t != UNTAGGED)

    def pause(self, tag=None):
        """Gives back the device memory of tag (None: every tag a region used; never untagged
        memory). A tag that nothing was allocated in, or a paused one, is left as it is."""
        for t in self._tags(tag):
            try:
                sleep(t, "disk" if t in _disk_tags else "host" if _region_tags.get(t) else "discard")
            except Error as e:
                if e.errno != errno.ENOENT:
                    raise

    def resume(self, tag=None):
        """Maps device memory at the same addresses again, with the bytes of regions made with
        enable_cpu_backup or enable_disk_backup (their files removed), zeros in the others. Without
        retain_cpu_backup, the host memory that held the bytes is given back, unless a tensor of
        get_cpu_backup(zero_copy=True) still lives (a warning): it is kept then, so that such a
        tensor never reads memory gone back to the system, but it no longer shows the paused bytes."""
        for t in self._tags(tag):
            try:
                wake(t, zero=not (_region_tags.get(t) or t in _disk_tags))
            except Error as e:
                if e.errno != errno.ENOENT:
                    raise
        with self._lock:
            self._views = [r for r in self._views if r() is not None]
            views = len(self._views)
        if views:
            warnings.warn("torch_memory_saver: %d tensor(s) of get_cpu_backup(zero_copy=True) still live after "
                          "resume(): they no longer show the paused bytes (the next pause may overwrite them); "
                          "the host memory under them is kept until they are gone" % views, RuntimeWarning,
                          stacklevel=2)
        elif not self._retain:
            release_host(0)

    # ------------------------------------------------------------ settings

    @property
    def enabled(self):
        """True when the shim is loaded in this process."""
        return loaded()

    @property
    def hook_mode(self):
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, mode):
        if mode not in _HOOK_MODES:
            raise ValueError("hook_mode: 'preload' or 'torch', not %r" % (mode,))
        self._hook_mode = mode  # both mean the shim, which serves every allocation

    @property
    def memory_margin_bytes(self):
        return self._margin

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        """Allocations that would leave less than value bytes of the device free fail as out of
        memory: the process's limit (VMMSHIM_LIMIT) becomes what it has mapped plus what
        cudaMemGetInfo says is free, less value; 0 removes the limit. The pools' idle memory is
        given back first (vmmshim_trim): cudaMemGetInfo counts it as free, but an allocation it
        serves maps nothing, so the limit, a cap on mapped bytes, would not stop it."""
        value = int(value)
        if value < 0:
            raise ValueError("memory_margin_bytes: %d is negative" % value)
        ctl = control(os.getpid())
        ctl.limit(0)
        self._margin = value
        if value == 0:
            return
        ctl.trim()
        free, _ = _mem_get_info()
        st = ctl.status()
        idle = sum(d.get("idle", 0) for d in st.get("devices", []))
        ctl.limit(max(1, st["mapped"] + max(0, free - idle) - value))

    @property
    def retain_cpu_backup(self):
        return self._retain

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        """True: the host memory of a CPU backup stays after resume(), for the next pause (the
        shim's own default); False: resume() gives it back."""
        self._retain = bool(value)

    def set_disk_backup_dir(self, path):
        """The directory of the files of regions made with enable_disk_backup, for the pauses from
        now on. Creates nothing: ValueError unless path is a writable directory."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError("set_disk_backup_dir: %r is not a directory" % path)
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError("set_disk_backup_dir: %r is not writable" % path)
        set_disk_dir(path)

    def configure_subprocess(self):
        return configure_subprocess()

    # ------------------------------------------------------------ CPU backup

    def get_cpu_backup(self, x, zero_copy=False):
        """A CPU tensor with the bytes of x, a contiguous CUDA tensor paused in a region made with
        enable_cpu_backup; None when x is awake, its bytes were not kept, or are in a file (disk
        backup). zero_copy=True: a tensor over the shim's host buffer itself, no copy, valid until
        resume() (a write to it changes what resume() restores); a copy, with a warning, where the
        bytes lie in two host buffers (64 MiB each) or the driver gave the CPU no access to them."""
        import torch
        if not x.is_cuda:
            raise ValueError("get_cpu_backup: %s is not a CUDA tensor" % x.device)
        if not x.is_contiguous():
            raise ValueError("get_cpu_backup: the tensor is not contiguous")
        nbytes = x.numel() * x.element_size()
        why = None
        if zero_copy and nbytes:
            try:
                where = host_view(x.data_ptr(), nbytes)
                if where is None:
                    return None  # awake
                buf = (ctypes.c_uint8 * nbytes).from_address(where)
                with self._lock:
                    self._views = [r for r in self._views if r() is not None] + [weakref.ref(buf)]
                return torch.frombuffer(buf, dtype=torch.uint8).view(x.dtype).view(x.shape)
            except Error as e:
                if e.errno not in (errno.EXDEV, errno.ENOTSUP):
                    raise
                why = e.errno
        out = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes and not _backup_into(x.data_ptr(), nbytes, out.data_ptr()):
            return None  # discarded or on disk
        if why == errno.EXDEV:
            warnings.warn("get_cpu_backup(zero_copy=True): the tensor's %d bytes lie in two of the shim's host "
                          "buffers (64 MiB each): a copy" % nbytes, RuntimeWarning, stacklevel=2)
        elif why == errno.ENOTSUP and not self._said_no_cpu:
            self._said_no_cpu = True
            warnings.warn("get_cpu_backup(zero_copy=True): the driver gives the CPU no access to the shim's host "
                          "buffers: copies", RuntimeWarning, stacklevel=2)
        return out.view(x.dtype).view(x.shape)


torch_memory_saver = TorchMemorySaver()
