"""The checks of the Python GPU tests (tests/gpu/*.py): one "PASS name"
or "FAIL name: why" line each, as tests/gpu/runner.sh's run_python counts them, and the closing
"PROG: N passed, N failed" line."""
import os
import sys

_counts = {"passed": 0, "failed": 0}


def check(ok, name, why=""):
    if ok:
        _counts["passed"] += 1
        print("PASS %s" % name)
    else:
        _counts["failed"] += 1
        print("FAIL %s: %s" % (name, why))
    sys.stdout.flush()


def failures():
    return _counts["failed"]


def summary(prog):
    """Prints the closing line; the exit status: 1 when a check failed, else 0."""
    print("%s: %d passed, %d failed" % (prog, _counts["passed"], _counts["failed"]))
    return 1 if _counts["failed"] else 0


def torch_nccl(lib, prog):
    """The start of the two-rank NCCL tests (group_ddp.py, residue_ddp.py): (torch, None) when
    PyTorch with CUDA and NCCL is here and the shim library lib exists, else (None, the exit
    status): 77 after a SKIP line, or the summary of a failed shim-library check."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("SKIP PyTorch is not installed")
        return None, 77
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("SKIP no CUDA device or no NCCL in this PyTorch")
        return None, 77
    if not lib or not os.path.exists(lib):
        check(False, "shim-library", "--lib %s: no such file" % lib)
        return None, summary(prog)
    return torch, None


def need_torch_cuda(lib):
    """The start of the drivers of rules_llm.py and torch_sleep.py: exits 77 after a SKIP line
    when PyTorch does not import or has no CUDA device, then checks that the shim library lib
    is there (the "library" check)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print("SKIP PyTorch cannot be imported: %s" % e)
        sys.exit(77)
    if not torch.cuda.is_available():
        print("SKIP PyTorch has no CUDA device")
        sys.exit(77)
    check(os.path.isfile(lib), "library", "%s is missing (make builds it)" % lib)
