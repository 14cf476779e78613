"""(g) Python smoke tests: python3 py_smoke.py torch|cupy|jax|torch-ipc|torch-dp|torch-dp-cache|torch-ddp|torch-async

Runs a small deterministic GPU computation and prints one "VALUE <name> <number>" line per
result, then "SHIM <summary>" and, under the shim, "VMM <name> yes|no" for a sample buffer.
tests/gpu/run.sh runs it once without and once with the shim and compares the VALUE lines
(relative 1e-6). Exit status: 0 done, 77 skipped (the framework or its GPU backend is not
there; a "SKIP reason" line says why), anything else a failure.

Environment that the frameworks need for every allocation to reach cudaMalloc/cuMemAlloc is
set here, before their import: PYTORCH_NO_CUDA_MEMORY_CACHING=1 (torch),
cupy.cuda.set_allocator(None) (cupy), XLA_PYTHON_CLIENT_ALLOCATOR=platform (jax)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vsstats  # noqa: E402

SKIP = 77


def skip(why):
    print("SKIP %s" % why)
    sys.exit(SKIP)


def value(name, x):
    print("VALUE %s %r" % (name, float(x)))


def report_shim(sample_ptr=None):
    st = vsstats.get_stats()
    print("SHIM %s" % vsstats.summary(st))
    if st is not None:
        print("SHIM_ALLOCS %d" % st["allocs_total"])
        if sample_ptr is not None:
            print("VMM sample %s" % ("yes" if vsstats.is_vmm(sample_ptr) else "no"))


def torch_with_cuda(name):
    """PyTorch, or a skip when it cannot be imported; a failure (named `name`) without CUDA."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        skip("torch: import failed: %s" % e)
    if not torch.cuda.is_available():
        print("FAIL %s: torch.cuda.is_available() is False" % name)
        sys.exit(1)
    return torch


def run_torch():
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch = torch_with_cuda("torch")
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device("cuda")

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5
            mask = torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.mlp(self.ln2(x))

    vocab, d, steps = 512, 128, 6
    model = nn.Sequential(nn.Embedding(vocab, d), Block(d, 4), Block(d, 4), nn.LayerNorm(d), nn.Linear(d, vocab))
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        tok = torch.randint(0, vocab, (8, 65), generator=g).to(dev)
        logits = model(tok[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value("loss_step%d" % step, loss.item())
    sample = torch.empty(1 << 20, device=dev)
    value("param_sum", sum(p.double().sum().item() for p in model.parameters()))
    torch.cuda.synchronize()
    report_shim(sample.data_ptr())


def run_cupy():
    try:
        import cupy as cp
        import numpy as np
    except Exception as e:  # noqa: BLE001
        skip("cupy: import failed: %s" % e)
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        print("FAIL cupy: no device: %s" % e)
        sys.exit(1)
    cp.cuda.set_allocator(None)
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal(1 << 22))
    m = cp.asarray(rng.standard_normal((512, 512)))
    value("sum_sin", (cp.sin(x) * x).sum())
    value("max", x.max())
    value("norm_mm", cp.linalg.norm(m @ m.T))
    y = cp.cumsum(cp.abs(x))
    value("cumsum_last", y[-1])
    big = cp.ones(64 << 20, dtype=cp.uint8)  # 64 MiB
    value("big_sum", big.sum(dtype=cp.uint64))
    cp.cuda.Device().synchronize()
    report_shim(int(big.data.ptr))


def run_jax():
    os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    # XLA times candidate GEMM algorithms and keeps the fastest: two runs without the shim
    # then differ in the last digits (measured: -889.6031 and -889.6051 for tanh_sum). With
    # autotuning off the algorithm, and so the result, is fixed.
    os.environ.setdefault("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
    except Exception as e:  # noqa: BLE001
        skip("jax: import failed: %s" % e)
    try:
        gpus = jax.devices("gpu")
    except Exception as e:  # noqa: BLE001
        skip("jax: no GPU backend: %s" % e)
    if not gpus:
        skip("jax: no GPU devices")

    @jax.jit
    def f(a, b):
        c = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
        return jnp.sum(jnp.tanh(c)), jnp.max(c), jnp.mean(jnp.sin(a) * b)

    rng = np.random.default_rng(0)
    a = jax.device_put(rng.standard_normal((1024, 1024), dtype=np.float32), gpus[0])
    b = jax.device_put(rng.standard_normal((1024, 1024), dtype=np.float32), gpus[0])
    s, mx, mean = f(a, b)
    value("tanh_sum", s)
    value("max", mx)
    value("mean", mean)
    ptr = None
    try:
        ptr = a.unsafe_buffer_pointer()
    except Exception:  # noqa: BLE001
        pass
    report_shim(ptr)


def _ipc_child(q_in, q_out):
    import torch
    x, y = q_in.get()  # CUDA tensors: opened here with cudaIpcOpenMemHandle
    q_out.put((float(x.double().sum().item()), float(y.double().sum().item())))
    x.mul_(2)  # written in place, seen by the parent
    y[1::2] = -1.0
    torch.cuda.synchronize()
    q_out.put("written")
    q_in.get()  # the parent has read them; the tensors are released here
    del x, y


def run_torch_ipc():
    """CUDA tensors sent to another process (torch.multiprocessing, spawn): it opens them with
    cudaIpcOpenMemHandle, reads and writes them in place; the parent sees its writes. PyTorch's
    caching allocator stays on: without it PyTorch cannot share CUDA tensors (it finds no base
    allocation for them: 'invalid device pointer', also without the shim); its segments are
    cudaMalloc blocks, which the shim serves."""
    torch = torch_with_cuda("torch")
    import torch.multiprocessing as mp
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1 << 20, generator=g, dtype=torch.float64).to(dev)  # 8 MiB
    y = torch.randn(3 << 18, generator=g).to(dev)[17:]  # a view: the handle is its block's, plus an offset
    torch.cuda.synchronize()
    value("x_sum", x.sum().item())
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_ipc_child, args=(q_in, q_out))
    child.start()
    q_in.put((x, y))
    try:
        sx, sy = q_out.get(timeout=60)
    except Exception as e:  # noqa: BLE001
        print("FAIL torch-ipc: no answer from the child: %r" % e)
        child.kill()
        sys.exit(1)
    value("child_x_sum", sx)
    value("child_y_sum", sy)
    if q_out.get(timeout=60) != "written":
        print("FAIL torch-ipc: the child did not write")
        sys.exit(1)
    torch.cuda.synchronize()
    value("x_sum_after_child", x.sum().item())
    value("y_sum_after_child", y.double().sum().item())
    q_in.put("done")
    child.join(60)
    if child.exitcode != 0:
        print("FAIL torch-ipc: child exit %s" % child.exitcode)
        sys.exit(1)
    value("child_exit", child.exitcode)
    report_shim(x.data_ptr())


def run_torch_async():
    """PyTorch with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: memory_allocated(),
    memory_reserved() and memory_stats() come from the device's default pool
    (cudaMemPoolGetAttribute), empty_cache() trims it (cudaMemPoolTrimTo), reset_peak_memory_stats()
    resets its high watermarks. The VALUE lines are the shape of those figures (1 or 0 each):
    non-zero while tensors live, back down after empty_cache(); the same with and without the
    shim. The figures themselves are printed as INFO lines."""
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    torch = torch_with_cuda("torch-async")
    backend = getattr(torch.cuda, "get_allocator_backend", lambda: "?")()
    if backend != "cudaMallocAsync":
        skip("torch-async: the allocator backend is %s" % backend)
    mib = 1 << 20
    dev = torch.device("cuda")
    torch.ones(1, device=dev)  # the context and the pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    sizes = [1 << 10, 3 * mib, 100 * mib]
    ts = [torch.ones(n // 4, device=dev) for n in sizes]
    torch.cuda.synchronize()
    alloc, res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    st = torch.cuda.memory_stats()
    print("INFO torch-async: base allocated %d reserved %d; with %d bytes of tensors: allocated %d reserved %d"
          % (base_alloc, base_res, sum(sizes), alloc, res))
    value("allocated_covers_tensors", alloc - base_alloc >= sum(sizes))
    value("reserved_covers_allocated", res >= alloc and res > 0)
    value("stats_agree", st.get("reserved_bytes.all.current") == res and st.get("allocated_bytes.all.current") == alloc)
    value("peak_at_least_allocated", torch.cuda.max_memory_allocated() >= alloc)
    peak = torch.cuda.max_memory_allocated()
    del ts[2]
    torch.cuda.synchronize()
    value("allocated_drops_on_free", torch.cuda.memory_allocated() <= alloc - 100 * mib)
    value("peak_kept_after_free", torch.cuda.max_memory_allocated() == peak)
    value("reserved_kept_after_free", torch.cuda.memory_reserved() >= res)
    torch.cuda.reset_peak_memory_stats()
    value("peak_reset_to_current", torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated())
    del ts
    torch.cuda.synchronize()
    value("allocated_back_to_base", torch.cuda.memory_allocated() == base_alloc)
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    print("INFO torch-async: reserved %d before empty_cache(), %d after" % (before, after))
    value("reserved_down_after_empty_cache", after < before)
    value("reserved_back_to_base", after <= base_res)
    sample = torch.empty(1 << 20, device=dev)
    torch.cuda.synchronize()
    report_shim(sample.data_ptr())


def run_torch_dp(cache=False):
    """nn.DataParallel over two GPUs: replicas, scatter and gather go through peer access; then a
    tensor copied from one GPU to the other and back. cache: with PyTorch's caching allocator
    (its blocks come from the shim's cudaMalloc), else every tensor is a cudaMalloc of its own."""
    if not cache:
        os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    torch = torch_with_cuda("torch-dp")
    import torch.nn as nn
    if torch.cuda.device_count() < 2:
        skip("torch-dp: %d GPU(s); DataParallel needs two" % torch.cuda.device_count())
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda(0)
    dp = nn.DataParallel(model, device_ids=[0, 1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        xb = torch.randn(64, 256, generator=g).cuda(0)
        loss = dp(xb).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value("loss_step%d" % step, loss.item())
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    # A copy between the GPUs, both ways, with work on each side.
    a = torch.randn(3, 1 << 20, generator=g).cuda(0)
    b = a.to("cuda:1", non_blocking=True) * 3
    c = b.to("cuda:0") - a
    value("copy_sum_on_1", b.double().sum().item())
    value("copy_back_maxdiff", (c - 2 * a).abs().max().item())
    report_shim(model[0].weight.data_ptr())


def _ddp_rank(rank, port, path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda(rank)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(4):
        xb = torch.randn(64, 256, generator=g).cuda(rank)
        loss = ddp(xb).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    w = model[0].weight.detach().double().sum()
    dist.all_reduce(w)
    torch.cuda.synchronize()
    with open("%s.%d" % (path, rank), "w") as f:
        f.write(" ".join(repr(x) for x in losses + [w.item()]))
    if rank == 0:  # the shim's view from a rank (the parent allocates nothing on the GPU)
        report_shim(model[0].weight.data_ptr())
        sys.stdout.flush()
    dist.destroy_process_group()


def run_torch_ddp():
    """DistributedDataParallel, two processes (one per GPU) with NCCL: the gradients' all-reduce
    goes between the GPUs; every rank's losses and the all-reduced weights are reported."""
    torch = torch_with_cuda("torch-ddp")
    if torch.cuda.device_count() < 2:
        skip("torch-ddp: %d GPU(s); two ranks need two" % torch.cuda.device_count())
    import socket
    import tempfile
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = os.path.join(tempfile.mkdtemp(prefix="vs-ddp-"), "losses")
    mp.spawn(_ddp_rank, args=(port, path), nprocs=2, join=True)
    import shutil
    for rank in (0, 1):
        with open("%s.%d" % (path, rank)) as f:
            xs = [float(x) for x in f.read().split()]
        for i, x in enumerate(xs[:-1]):
            value("rank%d_loss_step%d" % (rank, i), x)
        value("rank%d_weight_sum" % rank, xs[-1])
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    runs = {"torch": run_torch, "cupy": run_cupy, "jax": run_jax, "torch-ipc": run_torch_ipc, "torch-dp": run_torch_dp,
            "torch-dp-cache": lambda: run_torch_dp(cache=True), "torch-ddp": run_torch_ddp,
            "torch-async": run_torch_async}
    if which not in runs:
        print("usage: py_smoke.py torch|cupy|jax|torch-ipc|torch-dp|torch-dp-cache|torch-ddp|torch-async")
        sys.exit(2)
    runs[which]()
    print("DONE %s" % which)
