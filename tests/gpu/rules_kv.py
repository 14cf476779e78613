"""The KV cache of tests/gpu/rules_llm.py, in a file of its own: the tag rule py:*rules_kv.py
takes what is allocated from here (the tensors torch.cat makes as the cache grows), and nothing
else of the generator."""
import torch


class KVCache:
    """Per layer, keys and values of every position so far: [batch, positions, width], grown by
    torch.cat at each new position (a new tensor each time, the old one freed)."""

    def __init__(self, layers):
        self.k = [None] * layers
        self.v = [None] * layers

    def append(self, layer, k, v):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k.clone(), v.clone()
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=1)
            self.v[layer] = torch.cat([self.v[layer], v], dim=1)
        return self.k[layer], self.v[layer]

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)
