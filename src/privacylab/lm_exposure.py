"""The exposure job: how far each Secret-Sharer canary planted in a trained language model stands
out among all candidate secrets (Carlini et al. 2019, "The Secret Sharer", Sec. 4 and 5).

The attacker (`privacylab.attacks.language.exposure`, attack "secret-sharer") receives the
canary FORMATS of the corpus (prefix, alphabet, length, suffix: side information
`canary-formats`) and scores candidate secrets under the target. The truth then places each
canary's real secret among them:

- enumerated spaces (|R| <= `enumerate_limit` with method "auto"): the exact mid-rank of the
  canary's log-perplexity among all |R| candidates and exposure = log2|R| - log2 rank
  (`stats.exposure.rank_among`, `exposure_from_rank`); the skew-normal extrapolation fitted to
  a uniform sample of the same values is reported beside it (`extrapolated_exposure`),
  showing the extrapolation's error (Sec. 4.3);
- extrapolated spaces: -log2 CDF of the canary's log-perplexity (scored as one more query)
  under the skew-normal fitted to `samples` uniformly drawn candidates; `exposure` is that
  capped at log2|R| (a rank is at least 1) and `rank` = max(1, |R| CDF).

A user canary ("my PIN is {4829}") is ranked among the candidates of its alphabet and length;
one without a candidate space (length 0) is skipped with a note. Controls (0 repeats) should
sit near the random level 1/ln 2 ~ 1.44 bits; heavily repeated canaries near log2|R|.

The run is schemas.md's "exposure run". With a `ResultStore`, each format's canary rows are
stored as they finish, so a re-run after a kill resumes with the formats still missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from privacylab.attacks.core import execute
from privacylab.attacks.language.base import LanguageError
from privacylab.attacks.language.exposure import (
    METHODS,
    CanaryFormat,
    ExposureTask,
    FormatScores,
    SecretSharer,
)
from privacylab.attacks.language.scoring import score_texts
from privacylab.data.corpus import Canary, Corpus
from privacylab.execution.store import ResultStore, config_key
from privacylab.stats.exposure import (
    RANDOM_EXPOSURE,
    exposure_from_rank,
    rank_among,
)
from privacylab.stats.language import log_perplexity
from privacylab.target.language import LanguageTarget

__all__ = ["NAMESPACE", "canary_format", "exposure_run", "run_exposure"]

NAMESPACE = "lm-exposure"
"""Result-store namespace of finished formats."""

Progress = Callable[[str, float, float], None]
"""`progress(stage, done, total)`, as the CLI's stage bars take it."""


def canary_format(canary: Canary) -> CanaryFormat | None:
    """The attacker's view of `canary` (no secret); None when it has no candidate space."""
    if canary.length < 1 or not canary.alphabet:
        return None
    return CanaryFormat(canary.prefix, canary.alphabet, canary.length, canary.suffix)


def _row(
    canary: Canary, scores: FormatScores, target: LanguageTarget
) -> tuple[dict[str, Any], int]:
    """The canary's entry of the run and the truth-side queries it took."""
    fmt = scores.format
    size = fmt.space_size
    extra = 0
    if scores.method == "enumerate":
        index = fmt.index(canary.secret)
        value = float(scores.values[index])
        rank = rank_among(value, np.delete(scores.values, index))
        exposure = exposure_from_rank(rank, size)
        extrapolated = scores.fit.exposure(value) if scores.fit is not None else None
    else:
        before = target.queries
        value = log_perplexity(score_texts(target, [canary.text])[0].log_probs)
        extra = target.queries - before
        if scores.fit is None:
            raise LanguageError(f"the candidates of {canary.prefix!r}... could not be fitted")
        extrapolated = scores.fit.exposure(value)
        rank = max(1.0, min(float(size), float(size) * 2.0 ** (-extrapolated)))
        exposure = exposure_from_rank(rank, size)
    return {
        "prefix": canary.prefix,
        "suffix": canary.suffix,
        "alphabet": canary.alphabet,
        "length": canary.length,
        "repeats": canary.repeats,
        "user": canary.user,
        "space_bits": fmt.space_bits,
        "space_size": size,
        "method": scores.method,
        "log_perplexity": value,
        "rank": rank,
        "exposure": exposure,
        "extrapolated_exposure": extrapolated,
        "samples": scores.samples,
        "fit": scores.fit.to_dict() if scores.fit is not None else None,
    }, extra


def exposure_run(
    target: LanguageTarget,
    corpus: Corpus,
    facts: dict[str, Any],
    *,
    method: str = "auto",
    samples: int = 5000,
    enumerate_limit: int = 10**6,
    batch_size: int = 1024,
    seed: int = 0,
    store: ResultStore | None = None,
    identity: str = "",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The exposure run (module docstring) of every canary of `corpus` under `target`, with
    `facts` as its "target". `store` + `identity` (what names the model) make it resumable."""
    if method not in METHODS:
        raise LanguageError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    start = time.perf_counter()
    notes: list[str] = []
    groups: dict[CanaryFormat, list[Canary]] = {}
    for canary in corpus.canaries:
        fmt = canary_format(canary)
        if fmt is None:
            notes.append(
                f"canary {canary.text!r} has no candidate space (no alphabet or length): skipped"
            )
            continue
        groups.setdefault(fmt, []).append(canary)
    if not groups:
        raise LanguageError("the corpus has no canaries with a candidate space to rank")

    rows: list[dict[str, Any]] = []
    queries = 0
    resumed = 0
    for number, (fmt, canaries) in enumerate(groups.items()):
        stage = f"exposure {number + 1}/{len(groups)}: {fmt.prefix[:24]!r}"
        key = config_key(
            {
                "model": identity,
                "format": fmt.to_dict(),
                "method": method,
                "samples": samples,
                "enumerate_limit": enumerate_limit,
                "seed": seed,
                "secrets": [c.secret for c in canaries],
            }
        )
        done = store.get(NAMESPACE, key) if store is not None else None
        if done is not None:
            rows.extend(done["rows"])
            queries += int(done["queries"])
            resumed += 1
            if progress is not None:
                progress(stage, 1.0, 1.0)
            continue

        def tell(count: int, total: int, stage: str = stage) -> None:
            if progress is not None:
                progress(stage, float(count), float(total))

        attack = SecretSharer(
            method=method,
            enumerate_limit=enumerate_limit,
            samples=samples,
            batch_size=batch_size,
            seed=seed + number,
            progress=tell,
        )
        run = execute(attack, target, ExposureTask([fmt]))
        scores = run.output[0]
        spent = run.queries
        found = []
        for canary in canaries:
            row, extra = _row(canary, scores, target)
            spent += extra
            found.append(row)
        if store is not None:
            store.put(NAMESPACE, key, {"rows": found, "queries": spent})
        rows.extend(found)
        queries += spent
    return {
        "target": facts,
        "method": method,
        "canaries": rows,
        "random_exposure": RANDOM_EXPOSURE,
        "notes": notes,
        "formats": len(groups),
        "formats_resumed": resumed,
        "queries": queries,
        "seconds": time.perf_counter() - start,
    }


def run_exposure(
    target_dir: str | Path,
    *,
    method: str = "auto",
    samples: int = 5000,
    enumerate_limit: int = 10**6,
    batch_size: int = 1024,
    seed: int = 0,
    device: str = "cpu",
    store: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The exposure run of the model folder `target_dir` (a `privacylab lm train` folder): its
    corpus' canaries ranked under its model (scores access). `store`: a result-store file that
    makes the run resumable."""
    from privacylab.lm import folder_digest, language_target, load_language_model, target_facts

    folder = Path(target_dir)
    loaded = load_language_model(folder)
    facts = target_facts(folder, loaded)
    target = language_target(folder, "scores", device=device, loaded=loaded)
    with ResultStore(store) if store is not None else nullcontext() as results:
        return exposure_run(
            target,
            loaded.corpus,
            facts,
            method=method,
            samples=samples,
            enumerate_limit=enumerate_limit,
            batch_size=batch_size,
            seed=seed,
            store=results,
            identity=folder_digest(folder) if store is not None else "",
            progress=progress,
        )
