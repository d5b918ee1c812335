"""Adding a membership attack is one file: a module that registers its class joins the
registry, the default suite, the subsampled set and the aliases, with no other edit."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import torch
from torch import nn

from privacylab.attacks.membership import (
    ATTACKS,
    MembershipTask,
    default_suite,
    discover,
    make_attack,
    run_attack,
    subsampled_attacks,
)
from privacylab.experiment import resolve_attacks
from privacylab.target import Target

ATTACK_FILE = '''
"""A toy attack: the target's top probability."""

from typing import ClassVar

from privacylab.attacks.core import ThreatModel
from privacylab.attacks.membership import AttackScores, MembershipAttack, register_attack
from privacylab.target import Access


@register_attack("toy-top-probability")
class TopProbability(MembershipAttack):
    name = "toy-top-probability"
    threat_model: ClassVar[ThreatModel] = ThreatModel(Access.SCORES)
    subsampled = True
    aliases = ("toy",)

    def score(self, target, task):
        return AttackScores(target.probabilities(task.x).max(1).values.double().numpy())
'''


def test_a_dropped_module_joins_the_suite(tmp_path: Path) -> None:
    package = tmp_path / "toy_attacks_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "top_probability.py").write_text(textwrap.dedent(ATTACK_FILE))
    sys.path.insert(0, str(tmp_path))
    try:
        modules = discover("toy_attacks_pkg")
        assert [m.__name__ for m in modules] == ["toy_attacks_pkg.top_probability"]
        assert default_suite()[-1] == "toy-top-probability"
        assert "toy-top-probability" in subsampled_attacks()
        assert resolve_attacks(["toy", "loss"]) == ["toy-top-probability", "loss"]

        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        task = MembershipTask(torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2]), 3)
        truth = np.array([1, 1, 1, 0, 0, 0])
        result = run_attack(make_attack("toy"), Target(model, "logits", 3), task, truth)
        assert result.attack == "toy-top-probability" and result.queries == 6
        assert result.access == "scores"
    finally:
        ATTACKS.unregister("toy-top-probability")
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("toy_attacks_pkg")]:
            del sys.modules[name]
    assert "toy-top-probability" not in default_suite()
