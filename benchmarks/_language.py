"""Shared helpers of the language-model benchmarks (issue 15): TF Privacy's exposure module
loaded by path, the four ranking metrics of LM_Memorization written as a peer, ranking
agreement statistics, the cache-less generation loop a peer runs, and resumable model folders.

TF Privacy. ``tensorflow_privacy/privacy/privacy_tests/secret_sharer/exposures.py`` (release
0.8.12) imports numpy and scipy only, so it runs without TensorFlow when loaded by path:
`tf_privacy_exposures` unpacks it from the wheel ``pip download tensorflow-privacy==0.8.12
--no-deps`` fetches (once, into ``runs/bench-cache/tf-privacy``) and imports that file alone.

LM_Memorization (github:ftramer/LM_Memorization, ``extraction.py``, the code of Carlini et al.
2021) scores each generated text by GPT-2 XL's perplexity ``exp(loss)`` (the mean next-token
cross-entropy of ``model(input_ids, labels=input_ids)``), GPT-2 Small's, XL's on the lowercased
text and ``len(zlib.compress(bytes(text, "utf-8")))``, and sorts, highest first, by
``-log(ppl_XL)``, ``log(ppl_S) / log(ppl_XL)``, ``log(ppl_lower) / log(ppl_XL)`` and
``zlib / log(ppl_XL)``. `lm_memorization_metrics` states exactly those four formulas on given
token log-probabilities (not copied; the file has no function for them, they are inline in its
``main``).
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import time
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _reconstruction import BENCH_CACHE, clean, finish, fmt, log, open_store, ratio

TF_PRIVACY_VERSION = "0.8.12"
TF_EXPOSURES = "tensorflow_privacy/privacy/privacy_tests/secret_sharer/exposures.py"

BOS, EOS = 256, 257
VOCAB = 259


# ---------------------------------------------------------------------------------------------
# TF Privacy's exposures.py


def tf_privacy_exposures(path: str | None = None) -> tuple[ModuleType | None, str]:
    """TF Privacy's `exposures` module loaded by path (`path`: the .py file; None: the cached
    copy, downloaded with ``pip download tensorflow-privacy==0.8.12 --no-deps`` when absent),
    and a status line: "ok (...)" or why it is unavailable."""
    if path is None:
        folder = BENCH_CACHE / "tf-privacy"
        file = folder / TF_EXPOSURES
        if not file.exists():
            folder.mkdir(parents=True, exist_ok=True)
            log(f"downloading tensorflow-privacy=={TF_PRIVACY_VERSION} (no deps) into {folder}")
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    "-d",
                    str(folder),
                    f"tensorflow-privacy=={TF_PRIVACY_VERSION}",
                ],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            wheels = sorted(folder.glob("tensorflow_privacy-*.whl"))
            if done.returncode != 0 or not wheels:
                reason = (done.stderr or done.stdout).strip().splitlines()
                return None, f"unavailable: pip download failed: {reason[-1] if reason else ''}"
            with zipfile.ZipFile(wheels[0]) as wheel:
                wheel.extract(TF_EXPOSURES, folder)
        path = str(file)
    if not Path(path).is_file():
        return None, f"unavailable: no file {path}"
    spec = importlib.util.spec_from_file_location("tf_privacy_exposures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, f"ok (tensorflow-privacy {TF_PRIVACY_VERSION}, {TF_EXPOSURES} loaded by path)"


# ---------------------------------------------------------------------------------------------
# LM_Memorization's four metrics


def lm_memorization_metrics(
    text: str,
    log_probs: np.ndarray,
    small_log_probs: np.ndarray,
    lower_log_probs: np.ndarray,
) -> dict[str, float]:
    """LM_Memorization's ranking scores of one sample (github:ftramer/LM_Memorization,
    extraction.py, ``main``: "Sort by perplexity", "ratio of log perplexities of S and XL",
    "lower-case and normal-case", "Zlib entropy and XL perplexity"), from the per-token
    log-probabilities of the target (XL's role), the reference (S) and the target on the
    lowercased text: ppl = exp(mean NLL), as ``calculatePerplexity`` returns."""
    ppl_xl = math.exp(-float(np.mean(log_probs)))
    ppl_s = math.exp(-float(np.mean(small_log_probs)))
    ppl_lower = math.exp(-float(np.mean(lower_log_probs)))
    zlib_bytes = len(zlib.compress(bytes(text, "utf-8")))
    return {
        "perplexity": -math.log(ppl_xl),
        "small": math.log(ppl_s) / math.log(ppl_xl),
        "lowercase": math.log(ppl_lower) / math.log(ppl_xl),
        "zlib": zlib_bytes / math.log(ppl_xl),
    }


def ranking_agreement(ours: np.ndarray, theirs: np.ndarray, top: int = 100) -> dict[str, Any]:
    """How two score vectors over the same samples rank them (higher first): the overlap of
    their top `top` (as a fraction), whether the top-`top` order is identical, Kendall's tau
    over all samples (scipy, tau-b) and the largest relative score difference after matching
    scales by least squares (0 when one is a positive multiple of the other)."""
    from scipy.stats import kendalltau

    ours, theirs = np.asarray(ours, float), np.asarray(theirs, float)
    top = min(top, ours.size)
    a = np.argsort(-ours, kind="stable")[:top]
    b = np.argsort(-theirs, kind="stable")[:top]
    tau = kendalltau(ours, theirs).statistic if ours.size > 1 else math.nan
    return {
        "top": top,
        "top_overlap": len(set(a.tolist()) & set(b.tolist())) / max(top, 1),
        "same_top_order": bool(np.array_equal(a, b)),
        "kendall_tau": float(tau),
    }


# ---------------------------------------------------------------------------------------------
# generation: ours (KV cache, LanguageTarget.sample) and the cache-less peer loop


def top_n_no_eos(n: int, generator: torch.Generator) -> Callable[[Tensor, int], Tensor]:
    """Top-n sampling (Carlini et al. 2021, Sec. 5.1; n = 40) that never picks EOS, so every
    timed sample is exactly the asked number of tokens long."""

    def choose(log_probs: Tensor, step: int) -> Tensor:
        logp = log_probs.clone()
        logp[:, EOS] = -math.inf
        values, index = logp.topk(n, dim=-1)
        picked = torch.multinomial(values.softmax(-1), 1, generator=generator)
        return index.gather(-1, picked).squeeze(-1)

    return choose


@torch.no_grad()
def peer_generate(
    model: nn.Module,
    count: int,
    new_tokens: int,
    choose: Callable[[Tensor, int], Tensor],
    batch_size: int,
) -> Tensor:
    """What a generate loop without a key/value cache does (HF ``generate(use_cache=False)``,
    or a hand-written sampler calling ``model(input_ids)`` each step): every new token re-runs
    the model on the whole sequence so far and keeps the last position's logits."""
    rows = []
    for start in range(0, count, batch_size):
        seq = torch.full((min(batch_size, count - start), 1), BOS, dtype=torch.int64)
        for step in range(new_tokens):
            last = model(seq)[:, -1].float()
            seq = torch.cat([seq, choose(F.log_softmax(last, -1), step)[:, None]], 1)
        rows.append(seq)
    return torch.cat(rows)


def time_generation(
    model: nn.Module, count: int, new_tokens: int, *, batch_size: int, peer: bool, seed: int = 0
) -> dict[str, Any]:
    """Seconds to generate `count` samples of `new_tokens` tokens from BOS with top-40
    sampling: ours through `LanguageTarget.sample` (the model's KV cache), or `peer_generate`;
    and seconds per 1,000 samples."""
    from privacylab.target.language import LanguageTarget

    model.eval()
    choose = top_n_no_eos(40, torch.Generator().manual_seed(seed))
    start = time.perf_counter()
    if peer:
        out = peer_generate(model, count, new_tokens, choose, batch_size)
    else:
        target = LanguageTarget(model, "scores", VOCAB, batch_size=batch_size)
        out = target.sample(torch.full((count, 1), BOS, dtype=torch.int64), new_tokens, choose)
    seconds = time.perf_counter() - start
    assert out.shape == (count, 1 + new_tokens), out.shape
    return {
        "samples": count,
        "tokens": new_tokens,
        "seconds": seconds,
        "seconds_per_1000": seconds * 1000 / count,
    }


# ---------------------------------------------------------------------------------------------
# models


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def size_options(size: str) -> dict[str, int]:
    """The gpt options {dim, heads, blocks} of a named size (privacylab.lm.SIZES)."""
    from privacylab.lm import SIZES

    return dict(SIZES[size])


TRAINER_PID = "trainer.pid"
"""File naming the process that trains a model folder (another benchmark process waits)."""


def _wait_for_other_trainer(folder: Path) -> None:
    """Wait while another live process trains `folder` (its pid in `TRAINER_PID`)."""
    lock = folder / TRAINER_PID
    while lock.exists() and not (folder / "model.json").exists():
        try:
            pid = int(lock.read_text())
            if pid == os.getpid():
                return
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, FileNotFoundError):
            return
        log(f"{folder}: process {pid} is training it; waiting")
        time.sleep(15)


def train_folder(
    folder: Path,
    corpus: Any,
    size: str,
    *,
    epsilon: float | None = None,
    epochs: int | None = None,
    seed: int = 0,
    progress: Any = None,
) -> dict[str, Any]:
    """A trained model folder (privacylab.lm's contract) at `folder`: trained by
    `privacylab.lm.train_language_model` unless `folder/model.json` is already there (a re-run
    skips it; a killed training resumes from its checkpoint). Returns the target facts."""
    from privacylab.lm import LMConfig, target_facts, train_language_model

    _wait_for_other_trainer(folder)
    if not (folder / "model.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TRAINER_PID).write_text(str(os.getpid()))
        log(
            f"training {size} {'non-private' if epsilon is None else f'DP eps={epsilon}'} "
            f"-> {folder}"
        )
        start = time.perf_counter()
        config = LMConfig(size=size, epsilon=epsilon, epochs=epochs, seed=seed)
        train_language_model(corpus, config, folder, progress=progress)
        log(f"  trained in {time.perf_counter() - start:.0f}s")
        (folder / TRAINER_PID).unlink(missing_ok=True)
    else:
        log(f"{folder}: trained model found, skipped")
    return target_facts(folder)


def stderr_progress(label: str) -> Callable[..., None]:
    """A progress callback (description, done, total) that prints to stderr at most every ~5 s
    (rich bars need a terminal; this works in a log file too)."""
    last = [0.0]

    def progress(*args: Any) -> None:
        now = time.monotonic()
        if now - last[0] < 5.0:
            return
        last[0] = now
        parts = [str(a) if not isinstance(a, float) else f"{a:.0f}" for a in args]
        log(f"  [{label}] " + " ".join(parts))

    return progress


def cached_json(path: Path, compute: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
    """`compute()` once: its JSON kept at `path` (written atomically), read back on a re-run."""
    import json

    if path.exists():
        log(f"{path}: found, skipped")
        return json.loads(path.read_text())
    value = clean(dict(compute()))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=1))
    partial.replace(path)
    return value


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain text table."""
    cells = [[str(h) for h in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


__all__ = [
    "BENCH_CACHE",
    "cached_json",
    "clean",
    "finish",
    "fmt",
    "lm_memorization_metrics",
    "log",
    "open_store",
    "parameters",
    "peer_generate",
    "ranking_agreement",
    "ratio",
    "size_options",
    "stderr_progress",
    "table",
    "tf_privacy_exposures",
    "time_generation",
    "top_n_no_eos",
    "train_folder",
]
