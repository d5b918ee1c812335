"""The extraction job, `privacylab attack lm-extraction`: Carlini et al. 2021 ("Extracting
Training Data from Large Language Models") on a language model trained by `privacylab lm train`.

Who holds what:
- the attacker: the target behind `scores` access (the probability of any sequence, Sec. 3.1),
  public text (the corpus's HELD-OUT documents, never trained on: prefixes of the "prefix"
  strategy, Sec. 5.1.2) and its own smaller reference models (other model folders, white-box,
  their forward passes not counted as queries of the target);
- the evaluator: the corpus (member documents, planted records and canaries), shown to nobody
  before the ranking is done (`check_extractions`).

One attack per generation strategy (`samples` each), six ranking metrics (perplexity, one ratio
per reference model named by its size, zlib, lowercase, window), the top `top` per metric
checked against the members. Generations are written to a result store as each batch finishes
(default `target_dir/generations.sqlite`, keyed by the target's weights), so a killed run
resumes where it stopped (`seconds_per_1000_samples` then times the samples generated anew,
None when all came from the store). Returns the "extraction run" dict of the report
(schemas.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from privacylab.attacks.core import execute
from privacylab.attacks.language.base import LanguageError, whole_option
from privacylab.attacks.language.extraction import (
    MIN_MATCH,
    CarliniExtraction,
    ExtractionCandidates,
    ExtractionTask,
    check_extractions,
)
from privacylab.attacks.language.generation import STRATEGIES, Sampling
from privacylab.attacks.language.index import TrainingIndex
from privacylab.execution.store import ResultStore
from privacylab.lm import folder_digest, language_target, load_language_model, target_facts

__all__ = ["STORE_FILE", "parse_strategies", "run_lm_extraction"]

STORE_FILE = "generations.sqlite"

Progress = Callable[[str, float, float], None]


def parse_strategies(strategies: str | Sequence[str]) -> list[str]:
    """Generation strategies from a list or a comma-separated string, each known, no repeats;
    LanguageError naming the choices otherwise."""
    names = strategies.split(",") if isinstance(strategies, str) else list(strategies)
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise LanguageError(f"give at least one strategy: {', '.join(STRATEGIES)}")
    for name in names:
        if name not in STRATEGIES:
            raise LanguageError(
                f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)} (comma-separated)"
            )
    if len(set(names)) != len(names):
        raise LanguageError(f"strategy listed twice: {','.join(names)}")
    return names


def _reference_names(folders: Sequence[Path], sizes: Sequence[Any]) -> list[str]:
    names = [str(s) if s else f.name for f, s in zip(folders, sizes, strict=True)]
    if len(set(names)) != len(names):
        raise LanguageError(
            f"reference models need distinct sizes (got {', '.join(names)}): each names a metric"
        )
    return names


def run_lm_extraction(
    target_dir: str | Path,
    *,
    strategies: str | Sequence[str] = ("top-n",),
    samples: int = 1000,
    references: Sequence[str | Path] = (),
    top: int = 100,
    seed: int = 0,
    min_match: int = MIN_MATCH,
    window: int = 50,
    store_path: str | Path | None = None,
    device: str = "cpu",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Carlini et al. 2021's attack on the model in `target_dir` (module docstring): `samples`
    generations per strategy, ranked against each reference folder, the top `top` per metric
    checked (a sample is memorised when >= `min_match` bytes of it occur verbatim in a member
    document and in no held-out one). Returns the schemas.md "extraction run"."""
    folder = Path(target_dir)
    names = parse_strategies(strategies)
    samples = whole_option("lm-extraction", "samples", samples)
    top = whole_option("lm-extraction", "top", top)
    min_match = whole_option("lm-extraction", "min_match", min_match)
    loaded = load_language_model(folder)
    corpus = loaded.corpus
    ref_folders = [Path(r) for r in references]
    ref_models = [load_language_model(r) for r in ref_folders]
    ref_names = _reference_names(
        ref_folders, [m.metadata.get("language", {}).get("size") for m in ref_models]
    )
    target = language_target(folder, "scores", device=device, loaded=loaded)
    task = ExtractionTask(
        public_text=corpus.texts(corpus.heldout_indices),
        references={n: m.model for n, m in zip(ref_names, ref_models, strict=True)},
        progress=progress,
        store_key={"target": str(folder.resolve()), "weights": folder_digest(folder)},
    )
    start = time.perf_counter()
    runs: list[ExtractionCandidates] = []
    queries = 0
    with ResultStore(store_path if store_path is not None else folder / STORE_FILE) as store:
        task.store = store
        for name in names:
            attack = CarliniExtraction(
                Sampling(name), samples=samples, top=top, window=window, seed=seed
            )
            execution = execute(attack, target, task)
            queries += execution.queries
            runs.append(execution.output)
    if progress is not None:
        progress("checking against the training data", 0, 1)
    index = TrainingIndex(corpus.texts(corpus.member_indices))
    heldout = TrainingIndex(corpus.texts(corpus.heldout_indices))
    truth = check_extractions(runs, index, corpus, min_match=min_match, heldout=heldout)
    if progress is not None:
        progress("checking against the training data", 1, 1)
    generation = sum(r.generation_seconds for r in runs)
    fresh = sum(r.fresh for r in runs)
    return {
        "target": target_facts(folder, loaded),
        "references": [target_facts(r, m) for r, m in zip(ref_folders, ref_models, strict=True)],
        "samples": samples,
        **truth,
        "distinct": {r.strategy: len(r.texts) for r in runs},
        "queries": queries,
        "tokens_served": target.tokens_served,
        "seconds": time.perf_counter() - start,
        "seconds_per_1000_samples": 1000.0 * generation / fresh if fresh else None,
    }
