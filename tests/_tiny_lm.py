"""A tiny causal GPT fitted to a few texts, for the language-model tests: full-batch Adam
(lr 1e-2) on BOS + UTF-8 bytes + EOS, PAD positions ignored by the next-token loss.

    model = train_tiny_gpt(texts, steps=80, seed=0, context=48)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from privacylab.data.tokenizer import PAD, ByteTokenizer
from privacylab.models.gpt import CausalLM

VOCAB = 259


def train_tiny_gpt(texts: Sequence[str], steps: int, seed: int, context: int) -> CausalLM:
    """A GPT of dim 32, 2 heads, 1 block (seeded with `seed`) after `steps` full-batch Adam
    steps on `texts`, in eval mode; with no steps, the untrained model."""
    torch.manual_seed(seed)
    model = CausalLM(VOCAB, context, dim=32, heads=2, blocks=1)
    if steps == 0:
        return model.eval()
    tokenizer = ByteTokenizer()
    rows = [tokenizer.encode(t, bos=True, eos=True) for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    x, y = ids[:, :-1], ids[:, 1:].masked_fill(ids[:, 1:] == PAD, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
        opt.step()
    return model.eval()
