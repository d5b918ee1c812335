"""Sequence-level membership inference on DP-Forward, DP-SGD and non-private MiniLM models, on
every review and on the memorised subgroup (mixed reviews, whose label the text does not decide).

    python benchmarks/dpforward_mia.py [--json] --models DIR [DIR ...] [--seed 0]

Du et al. 2023 (DP-Forward, Sec. 6.2) test membership with confidence and entropy thresholds and
enlarge the members' advantage by perturbing test tokens. Here the same attacks and the loss
attack (Yeom et al. 2018) run on the deployed classifier through privacylab's one membership
path (`privacylab.attacks.membership`, `privacylab.report.metrics.membership_metrics`), on ALL
members against ALL non-members of a model folder's review corpus (960 / 720 by default), and on
the mixed reviews alone (`privacylab.data.reviews`: 15% of reviews mix praise and complaint and
carry a random label, the examples a model can only get right by memorising them). For a
DP-Forward model the queries go through its release layer (fresh noise per query, as deployed).
Folders are those of `privacylab dpforward train` (e.g. `benchmarks/dpforward_table.py --work`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ATTACKS = ("loss", "confidence", "entropy")


def measure(folder: Path, seed: int) -> dict[str, Any]:
    """AUC / TPR at 1% FPR / advantage of each attack, on all reviews and on mixed ones."""
    from privacylab.attacks.membership.base import MembershipTask, make_attack, run_attack
    from privacylab.dpforward import load_dpforward
    from privacylab.models.minilm import encode_texts
    from privacylab.report.metrics import membership_metrics
    from privacylab.target.embedding import EmbeddingTarget

    loaded = load_dpforward(folder)
    if loaded.model.release is not None:
        loaded.model.release.start_session(seed)
    target = EmbeddingTarget(loaded.model, "scores", length=loaded.config.max_len)
    train, test = loaded.reviews.subset("train"), loaded.reviews.subset("test")
    out: dict[str, Any] = {
        "facts": {k: loaded.facts.get(k) for k in ("method", "position", "epsilon", "accuracy")}
    }
    for group in ("all", "mixed"):
        keep_in = np.ones(len(train), bool) if group == "all" else np.asarray(train.mixed)
        keep_out = np.ones(len(test), bool) if group == "all" else np.asarray(test.mixed)
        texts = [t for t, k in zip(train.texts, keep_in, strict=True) if k] + [
            t for t, k in zip(test.texts, keep_out, strict=True) if k
        ]
        labels = np.concatenate([train.labels[keep_in], test.labels[keep_out]])
        truth = np.r_[np.ones(int(keep_in.sum()), int), np.zeros(int(keep_out.sum()), int)]
        ids = encode_texts(loaded.tokenizer, texts, loaded.config.max_len)
        task = MembershipTask(ids, torch.as_tensor(labels), loaded.model.num_classes)
        rows = {}
        for name in ATTACKS:
            result = run_attack(make_attack(name, thresholds="global"), target, task, truth)
            metrics = membership_metrics(result).to_dict()
            rows[name] = {k: metrics[k] for k in ("auc", "tpr_at_1pct_fpr", "advantage")}
        out[group] = {"members": int(keep_in.sum()), "non_members": int(keep_out.sum()), **rows}
        print(
            f"{folder.name} {group}: "
            + ", ".join(f"{n} {rows[n]['auc']:.3f}" for n in ATTACKS)
            + f" ({int(keep_in.sum())} vs {int(keep_out.sum())})",
            file=sys.stderr,
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", required=True, help="model folders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    results = {str(p): measure(Path(p), args.seed) for p in args.models}
    if args.json:
        print(json.dumps(results))
        return 0
    for path, r in results.items():
        for group in ("all", "mixed"):
            g = r[group]
            aucs = "  ".join(f"{n} {g[n]['auc']:.3f}" for n in ATTACKS)
            print(
                f"{Path(path).name:28s} {group:5s} {aucs}  ({g['members']} vs {g['non_members']})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
