"""Functionally-equivalent extraction of fully connected ReLU networks from float64 logits
(`relu-exact`): critical points on lines (`critical`), layer-by-layer hyperplane recovery
(`layers`), precision refinement (`refine`), sign recovery (`signs`) and the attack that puts
them together (`attack`)."""

from privacylab.attacks.extraction.relu import attack, critical, layers, oracle, refine, signs

__all__ = ["attack", "critical", "layers", "oracle", "refine", "signs"]
