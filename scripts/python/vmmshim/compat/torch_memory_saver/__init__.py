"""`import torch_memory_saver` in a program run by `vmmshim --as torch_memory_saver` (or with
VMMSHIM_AS=torch_memory_saver): the launcher puts this directory's parent first on PYTHONPATH, so
the program gets vmmshim.torch_memory_saver, the shim's compatible module, under that name."""
from vmmshim.torch_memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver  # noqa: F401

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]
