"""Same seed, same weights — in another process with another string-hash seed too."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import torch
from privacylab.data import load_dataset
from privacylab.models import build_model
from privacylab.training import PrivacyConfig, TrainConfig, train
d = load_dataset("digits").subset(range(200))
m = build_model("mlp", d.input_shape, 10, widths=(8,), seed=0)
train(m, d, TrainConfig(epochs=1, batch_size=50, lr=0.1, privacy=PrivacyConfig(epsilon=2.0)))
print(repr(float(sum(p.detach().double().sum() for p in m.parameters()))))
"""


def test_dp_training_does_not_depend_on_the_string_hash_seed() -> None:
    """Ghost clipping draws each layer's noise in parameter order, never in set order."""
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout.strip())
    assert len(outputs) == 1, outputs
