"""A small decoder-only transformer for the PyTorch benchmarks (bench/torch_step.py,
bench/torch_frag.py). Written out by hand, with plain matmul attention, so that every run with
the same seed computes bit for bit the same thing whatever the allocator: run-to-run equal
losses are how the benchmarks check that the shim changes nothing but where memory lives.
Call setup() before importing torch elsewhere (it sets the cuBLAS workspace for determinism)."""
import os
import time


def setup():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    return torch


def build(torch, d_model=512, layers=4, heads=8, vocab=8192, device="cuda"):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc1 = nn.Linear(d_model, 4 * d_model)
            self.fc2 = nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            b, t, d = x.shape
            hd = d // heads
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) * (hd ** -0.5)
            causal = torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1)
            att = att.masked_fill(causal, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d_model)
            self.pos = nn.Parameter(torch.randn(1024, d_model) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, tok):
            x = self.emb(tok) + self.pos[: tok.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    model = Model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    return model, opt


def batches(torch, vocab, batch, seq_lens, device="cuda"):
    """Token batches from a CPU generator with a fixed seed (identical on every run)."""
    g = torch.Generator().manual_seed(1234)
    for t in seq_lens:
        yield torch.randint(0, vocab, (batch, t + 1), generator=g).to(device)


def train_step(torch, model, opt, tok, vocab):
    logits = model(tok[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tok[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def timed(torch, fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return r, (time.perf_counter() - t0) * 1e3
