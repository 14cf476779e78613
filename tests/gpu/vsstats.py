"""The shim seen from Python, without linking to it: vmmshim_get_stats through the process's
global symbol table (present only under LD_PRELOAD=libvmmshim.so), and a VMM check through
the driver's cuMemRetainAllocationHandle. Used by tests/gpu/py_smoke.py and the bench scripts."""
import ctypes

_U64 = ctypes.c_uint64


class VmmshimStats(ctypes.Structure):
    # Mirrors vmmshim_stats_t in include/vmmshim.h (VMMSHIM_API_COUNT = 4).
    _fields_ = [
        ("allocs", _U64 * 4),
        ("frees", _U64 * 4),
        ("alloc_failures", _U64),
        ("passthrough_allocs", _U64),
        ("bytes_in_use", _U64),
        ("peak_bytes_in_use", _U64),
        ("bytes_requested_in_use", _U64),
        ("bytes_mapped", _U64),
        ("peak_bytes_mapped", _U64),
        ("vmm_calls", _U64),
        ("vmm_ns", _U64),
        ("syncs", _U64),
        ("trims", _U64),
        ("pools", _U64),
    ]


def get_stats():
    """A dict of the shim's counters, or None when the shim is not loaded."""
    try:
        fn = ctypes.CDLL(None).vmmshim_get_stats
    except (AttributeError, OSError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(VmmshimStats), ctypes.c_size_t]
    s = VmmshimStats()
    if fn(ctypes.byref(s), ctypes.sizeof(s)) != 0:
        return None
    d = {name: getattr(s, name) for name, _ in VmmshimStats._fields_}
    d["allocs"] = list(s.allocs)
    d["frees"] = list(s.frees)
    d["allocs_total"] = sum(d["allocs"])
    d["frees_total"] = sum(d["frees"])
    return d


_cuda = None


def is_vmm(ptr):
    """True when device address ptr lies in VMM-mapped memory (the calling thread must have
    the context current, as it has after any framework call on the device)."""
    global _cuda
    if _cuda is None:
        _cuda = ctypes.CDLL("libcuda.so.1")
        _cuda.cuMemRetainAllocationHandle.argtypes = [ctypes.POINTER(_U64), ctypes.c_void_p]
        _cuda.cuMemRetainAllocationHandle.restype = ctypes.c_int
        _cuda.cuMemRelease.argtypes = [_U64]
        _cuda.cuMemRelease.restype = ctypes.c_int
    h = _U64(0)
    if _cuda.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(ptr)) != 0:
        return False
    _cuda.cuMemRelease(h)
    return True


def summary(d):
    """One line for logs."""
    if d is None:
        return "shim not loaded"
    return ("allocs rt=%d rt_async=%d drv=%d drv_async=%d passthrough=%d peak_in_use=%d "
            "peak_mapped=%d vmm_calls=%d syncs=%d" % (
                d["allocs"][0], d["allocs"][1], d["allocs"][2], d["allocs"][3],
                d["passthrough_allocs"], d["peak_bytes_in_use"], d["peak_bytes_mapped"],
                d["vmm_calls"], d["syncs"]))
