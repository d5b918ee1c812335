"""Training causal language models on a `Corpus`, non-privately or with DP-SGD, and loading them
back as attack targets.

The target models of the language-model family: a byte-level GPT (`privacylab.models.gpt`,
Radford et al. 2019) trained on the member documents of a `privacylab.data.corpus.Corpus` with
the project's one trainer (`privacylab.training.train`), Adam, next-token cross-entropy averaged
over each document's tokens. Private training is DP-SGD (Abadi et al. 2016, Alg. 1) with Poisson
sampling and ghost clipping (Li et al. 2022, "Large Language Models Can Be Strong Differentially
Private Learners", Sec. 4): a whole document is the unit of privacy, so one document's gradient
is clipped and ε bounds what the model reveals about any one document. Li et al.'s recipe
(Sec. 3: large batches, Adam, a larger learning rate, a small clipping norm, more epochs) sets
the private defaults.

A trained model is a folder (the "Model folder" contract of the family): `model.safetensors` +
`model.json` (`privacylab.models.save_model`, spec "gpt", metadata["language"] with size,
parameter count, context, privacy, epochs, seconds and perplexities) and `corpus.json` (the
truth: members, planted records and canaries). `load_language_model`, `language_target` and
`target_facts` read it back for the attack jobs.

Fine-tuning (Li et al. 2022's setting, Sec. 3: DP fine-tuning of a publicly pretrained model):
`LMConfig.init` names a model folder whose weights (same spec: gpt, same size and context) are
the starting point; training then proceeds on the given corpus as from scratch. No pretrained
weights can be downloaded here, so the pretrained model is one of ours, trained on the public
pydoc chunks the private corpus does not use (`privacylab.data.corpus_build.public_corpus`).

Perplexity is per token over documents framed as BOS + text + EOS (every token after BOS is
predicted): exp of the mean negative log-likelihood of all those tokens (Carlini et al. 2021,
Sec. 6.1, "perplexity" of a sequence, pooled over documents).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privacylab.data.corpus import CORPUS_FILE, Corpus, load_corpus
from privacylab.data.errors import DataError
from privacylab.data.tokenizer import PAD, VOCAB_SIZE, ByteTokenizer
from privacylab.errors import PrivacylabError
from privacylab.models import ModelSpec, load_model, save_model
from privacylab.models.errors import ModelError
from privacylab.models.gpt import CausalLM
from privacylab.models.storage import SIDECAR_FILE, WEIGHTS_FILE
from privacylab.target.language import LanguageTarget
from privacylab.training import PrivacyConfig, TrainConfig, train

__all__ = [
    "IGNORE",
    "SIZES",
    "LMConfig",
    "LMError",
    "LoadedLM",
    "document_perplexity",
    "folder_digest",
    "language_target",
    "lm_examples",
    "load_language_model",
    "next_token_loss",
    "target_facts",
    "train_language_model",
]

IGNORE = -100
"""Target id of a position that is not trained on (PAD after EOS): cross-entropy's ignore_index."""

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"dim": 32, "heads": 2, "blocks": 1},
    "small": {"dim": 96, "heads": 4, "blocks": 2},
    "medium": {"dim": 160, "heads": 4, "blocks": 4},
}
"""gpt options {dim, heads, blocks} of each named size; with the byte vocabulary (259) and a
context of 128: tiny 33,699 parameters, small 286,147, medium 1,341,059."""

EPOCHS: dict[str, int] = {"tiny": 20, "small": 12, "medium": 12}
"""Non-private default epochs per size. Measured on the 2-core CPU of issue 15 (one thread,
the machine shared) on the default corpus (1,000 member documents, context 128): tiny 52,
small 136, medium 422 CPU-seconds in all (training and the trainer's per-epoch evaluation),
perplexity members / held-out 8.4 / 15.2, 4.7 / 13.3 and 3.0 / 13.5; medium's planted records
with >= 8 copies reach 1.06-1.56 per-token perplexity (1 copy: 2.6). Nothing here sets torch's
threads: `privacylab lm train` runs with torch's default, one per core (2 here), unless
OMP_NUM_THREADS says otherwise."""

DP_EPOCHS: dict[str, int] = {"tiny": 20, "small": 12, "medium": 12}
"""Private default epochs per size. Li et al. 2022 (Sec. 3) train longer under DP; a DP epoch of
medium costs ~45 CPU-seconds (ghost clipping; ~35 non-private), so the issue's experiment keeps
the number of epochs of non-private training to fit its 30 minutes: pass `epochs` for more.
Measured (medium, default corpus, eps = 8, delta = 1e-5, PLD): sigma 1.33, q 0.256, 48 steps,
574 CPU-seconds, perplexity members / held-out 19.4 / 23.3 against 3.0 / 13.5 non-private; the
planted records' per-token perplexity stays ~18-20 for 1-16 copies (12.2 at 64)."""

LR = 2e-3
"""Adam's default learning rate, non-private."""

DP_LR = 3e-3
"""Adam's default learning rate under DP-SGD (Li et al. 2022 use larger rates with DP)."""

BATCH = 64
DP_BATCH = 256
"""Default batch sizes (documents): DP-SGD's is large (Li et al. 2022, Sec. 3.1: the signal of the
mean clipped gradient grows with the batch, the noise does not)."""

DP_CLIP = 0.5
"""Default clipping norm under DP (Li et al. 2022 use a small one, Sec. 3.1)."""

ACCOUNTANT = "pld"

EVAL_DOCUMENTS = 250
"""At most this many held-out documents (evenly spaced) are the trainer's per-epoch evaluation
data; the final perplexities use all of them."""


class LMError(PrivacylabError, ValueError):
    """A bad language-model option or model folder; the message is one line."""


@dataclass(frozen=True)
class LMConfig:
    """How to train a language model. `epochs`, `lr`, `batch_size` and `max_grad_norm` None take
    the defaults of the size and of the privacy (non-private or DP, see the module constants);
    `epsilon` None trains non-privately, else DP-SGD to (`epsilon`, `delta`) as bounded by
    `accountant` (privacylab.accounting's names: "pld" by default, "rdp", ...); `init` a model
    folder whose weights start the training (fine-tuning; None: a seeded random start)."""

    size: str = "small"
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    epsilon: float | None = None
    delta: float = 1e-5
    max_grad_norm: float | None = None
    accountant: str = ACCOUNTANT
    seed: int = 0
    device: str = "cpu"
    options: dict[str, int] = field(default_factory=dict)
    init: str | None = None

    @property
    def private(self) -> bool:
        """Whether DP-SGD is used."""
        return self.epsilon is not None

    def validate(self) -> LMConfig:
        """Check every option; LMError or TrainingError with one line for the first bad one."""
        if self.size not in SIZES:
            raise LMError(f"unknown model size {self.size!r}; choose one of {', '.join(SIZES)}")
        from privacylab.accounting import make_accountant

        if self.private:
            try:
                make_accountant(self.accountant)
            except PrivacylabError as error:
                raise LMError(str(error)) from None
        for key, value in self.options.items():
            if key not in ("dim", "heads", "blocks"):
                raise LMError(f"unknown gpt option {key!r}; allowed: dim, heads, blocks")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LMError(f"gpt option {key} must be a whole number >= 1, got {value!r}")
        if self.init is not None and not Path(self.init).is_dir():
            raise LMError(f"--init {self.init} is not a model folder")
        self.train_config().validate()
        return self

    def gpt_options(self) -> dict[str, int]:
        """The model's {dim, heads, blocks}: the size's, overridden by `options`."""
        return {**SIZES[self.size], **self.options}

    def resolved(self, members: int | None = None) -> LMConfig:
        """This configuration with every default filled in; with `members` (the number of
        training documents) the default DP batch is at most a third of them (q <= 1/3)."""
        dp = self.private
        dp_batch = DP_BATCH if members is None else max(1, min(DP_BATCH, members // 3))
        return replace(
            self,
            epochs=self.epochs
            if self.epochs is not None
            else (DP_EPOCHS if dp else EPOCHS)[self.size],
            batch_size=self.batch_size
            if self.batch_size is not None
            else (dp_batch if dp else BATCH),
            lr=self.lr if self.lr is not None else (DP_LR if dp else LR),
            max_grad_norm=self.max_grad_norm
            if self.max_grad_norm is not None
            else (DP_CLIP if dp else 1.0),
        )

    def train_config(self, members: int | None = None) -> TrainConfig:
        """The trainer's configuration (Adam; DP-SGD with ghost clipping when private) for
        `members` training documents (see `resolved`)."""
        if self.size not in SIZES:
            raise LMError(f"unknown model size {self.size!r}; choose one of {', '.join(SIZES)}")
        full = self.resolved(members)
        privacy = None
        if self.private:
            privacy = PrivacyConfig(
                epsilon=full.epsilon,
                delta=full.delta,
                max_grad_norm=full.max_grad_norm,  # type: ignore[arg-type]
                clipping="ghost",
                sampling="poisson",
                accountant=full.accountant,
            )
        return TrainConfig(
            epochs=full.epochs,  # type: ignore[arg-type]
            batch_size=full.batch_size,  # type: ignore[arg-type]
            lr=full.lr,  # type: ignore[arg-type]
            optimizer="adam",
            seed=full.seed,
            device=full.device,
            privacy=privacy,
        )


@dataclass
class LoadedLM:
    """A model folder read back: the model (eval mode), its spec, its metadata and its corpus."""

    model: CausalLM
    spec: ModelSpec
    metadata: dict[str, Any]
    corpus: Corpus

    @property
    def language(self) -> dict[str, Any]:
        """metadata["language"]: size, parameters, context, privacy, perplexity..."""
        return dict(self.metadata.get("language", {}))

    @property
    def context(self) -> int:
        """Longest token sequence the model takes."""
        return int(self.spec.input_shape[0])


def lm_examples(corpus: Corpus, indices: Sequence[int] | np.ndarray) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets of the documents at `indices`: each document as BOS + UTF-8
    bytes + EOS right-padded with PAD to `corpus.context` tokens; x = all but the last position,
    y = all but the first (y[t] follows x[..t]), PAD targets replaced by `IGNORE`. Both
    (n, context - 1) int64."""
    return _next_token_pairs(corpus.texts(indices), corpus.context)


def _next_token_pairs(texts: Sequence[str], context: int) -> tuple[Tensor, Tensor]:
    """`texts` framed BOS + text + EOS, PAD-padded to `context`, split into (x, y) as in
    `lm_examples`."""
    rows = ByteTokenizer().batch(texts, context)
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].clone()
    y[y == PAD] = IGNORE
    return x, y


def next_token_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Per-document loss, shape (B,): the mean next-token cross-entropy over the positions whose
    target is not `IGNORE` (a document's own tokens and its EOS)."""
    tokens = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).reshape(y.shape)
    counted = (y != IGNORE).sum(dim=1).clamp_min(1)
    return tokens.sum(dim=1) / counted


@torch.no_grad()
def _token_nll(model: nn.Module, x: Tensor, y: Tensor, chunk: int = 256) -> tuple[float, int]:
    """Sum of next-token negative log-likelihoods over the non-ignored targets, and their count."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(x), chunk):
        xb, yb = x[i : i + chunk].to(device), y[i : i + chunk].to(device)
        logits = model(xb)
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).double(),
            yb.reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )
        total += float(nll)
        count += int((yb != IGNORE).sum())
    return total, count


def document_perplexity(model: nn.Module, texts: Sequence[str], context: int) -> float:
    """exp(mean per-token negative log-likelihood) of `texts`, each framed as BOS + text + EOS
    in `context` tokens, pooled over all predicted tokens (NaN for no texts)."""
    if not texts:
        return math.nan
    total, count = _token_nll(model, *_next_token_pairs(list(texts), context))
    return math.exp(total / count) if count else math.nan


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


Progress = Callable[[str, float, float], None]


def _claim(folder: Path, corpus: Corpus) -> None:
    """Write `folder/corpus.json` before training, so that a re-run (which resumes from the
    checkpoint) is refused when it brings another corpus."""
    path = folder / CORPUS_FILE
    if path.is_file():
        try:
            same = load_corpus(path).to_dict() == corpus.to_dict()
        except DataError:
            same = False
        if not same:
            raise LMError(
                f"{folder} holds a model of another corpus; use another output folder or delete it"
            )
        return
    corpus.save(folder)


INIT_FILE = "init.json"
"""Written beside corpus.json before fine-tuning: the init folder and its digest, so that a
re-run (which resumes from the checkpoint) is refused when it brings other starting weights."""


def _initial_weights(init: str | Path, spec: ModelSpec) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The state dict of the model folder `init` and {"folder", "digest"}; LMError (one line)
    naming the first mismatch with `spec` (architecture, context, size)."""
    path = Path(init)
    if not path.is_dir():
        raise LMError(f"--init {path} is not a model folder")
    try:
        model, given, _ = load_model(path)
    except ModelError as error:
        raise LMError(f"--init {path}: {error}") from None
    if given.name != spec.name:
        raise LMError(f"--init {path} holds a {given.name!r} model, not a language model (gpt)")
    if tuple(given.input_shape) != tuple(spec.input_shape):
        raise LMError(
            f"--init {path} has context {given.input_shape[0]}; this corpus has context "
            f"{spec.input_shape[0]}"
        )
    if dict(given.options) != dict(spec.options):
        raise LMError(
            f"--init {path} is a gpt of {dict(given.options)}; this run trains "
            f"{dict(spec.options)} (another --size)"
        )
    return model.state_dict(), {"folder": str(path), "digest": folder_digest(path)}


def _claim_init(folder: Path, init: dict[str, Any] | None, resumed: bool) -> None:
    """Record `init` in `folder/INIT_FILE`, or LMError when a run in `folder` (`resumed`: its
    corpus.json was there before this run) started from other weights."""
    path = folder / INIT_FILE
    if path.is_file():
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError):
            earlier = {"init": "unreadable"}
    else:
        earlier = {"init": None} if resumed else None
    now = {"init": None if init is None else init["digest"]}
    if earlier is not None and earlier != now:
        raise LMError(
            f"{folder} holds a model fine-tuned from other weights (another --init); use another "
            "output folder or delete it"
        )
    if earlier is None or not path.is_file():
        path.write_text(json.dumps(now))


def _finished_seconds(folder: Path) -> float:
    """The training seconds a finished earlier run recorded in `folder` (0 when none): a re-run
    resumes from its final checkpoint and adds only its own time."""
    if not (folder / SIDECAR_FILE).is_file():
        return 0.0
    try:
        _, _, metadata = load_model(folder)
    except ModelError:
        return 0.0
    seconds = metadata.get("language", {}).get("seconds")
    return float(seconds) if isinstance(seconds, (int, float)) else 0.0


def train_language_model(
    corpus: Corpus,
    config: LMConfig,
    out: str | Path,
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train a GPT of `config.size` on `corpus`'s member documents and write the model folder
    `out` (module docstring); returns its metadata["language"]. Up to `EVAL_DOCUMENTS` held-out
    documents are the trainer's per-epoch evaluation data. The trainer checkpoints after each
    epoch in `out/checkpoint`: a killed run re-run with the same corpus, configuration and
    `out` resumes to the same weights (and ε); "seconds" adds the time of a finished earlier run
    in `out` (a killed run's time is lost). `progress(stage, done, total)` is called after
    each epoch."""
    if not isinstance(corpus, Corpus):
        raise LMError(f"train_language_model needs a Corpus, got {type(corpus).__name__}")
    config = config.validate()
    members, heldout = corpus.member_indices, corpus.heldout_indices
    full = config.resolved(len(members))
    train_config = config.train_config(len(members))
    context = int(corpus.context)
    if context < 3:
        raise LMError(f"the corpus context must be at least 3 tokens, got {context}")
    options = config.gpt_options()
    if options["dim"] % options["heads"]:
        raise LMError(f"gpt dim {options['dim']} must be divisible by heads {options['heads']}")
    spec = ModelSpec("gpt", (context,), VOCAB_SIZE, options)
    model = spec.build(seed=config.seed)
    init = None
    if config.init is not None:
        weights, init = _initial_weights(config.init, spec)
        model.load_state_dict(weights)
    try:
        x, y = lm_examples(corpus, members)
        watched = heldout[:: max(1, math.ceil(len(heldout) / EVAL_DOCUMENTS))]
        eval_data = lm_examples(corpus, watched) if len(watched) else None
    except DataError as error:
        raise LMError(str(error)) from None
    if train_config.privacy is not None and full.batch_size > len(members):  # type: ignore[operator]
        raise LMError(
            f"the DP batch size {full.batch_size} exceeds the {len(members)} member documents"
        )
    folder = Path(out)
    stage = f"train {config.size}" + (f" DP eps={config.epsilon:g}" if config.private else "")
    epochs = int(full.epochs)  # type: ignore[arg-type]

    def report(record: Any) -> None:
        if progress is not None:
            progress(stage, float(record.epoch), float(epochs))

    resumed = (folder / CORPUS_FILE).is_file()
    _claim(folder, corpus)
    _claim_init(folder, init, resumed)
    earlier = _finished_seconds(folder)
    start = time.perf_counter()
    if progress is not None:
        progress(stage, 0.0, float(epochs))
    result = train(
        model,
        (x, y),
        train_config,
        eval_data=eval_data,
        checkpoint_dir=folder / "checkpoint",
        loss_fn=next_token_loss,
        progress=report,
    )
    seconds = earlier + time.perf_counter() - start
    trained = result.model
    spent = result.privacy
    language = {
        "size": config.size,
        "parameters": _parameters(trained),
        "context": context,
        "private": config.private,
        "epsilon": float(spent.epsilon) if spent is not None else None,
        "target_epsilon": float(config.epsilon) if config.epsilon is not None else None,
        "delta": float(spent.delta) if spent is not None else None,
        "accountant": spent.accountant if spent is not None else None,
        "noise_multiplier": float(spent.noise_multiplier) if spent is not None else None,
        "sample_rate": float(spent.sample_rate) if spent is not None else None,
        "steps": int(spent.steps) if spent is not None else None,
        "max_grad_norm": float(full.max_grad_norm) if config.private else None,  # type: ignore[arg-type]
        "epochs": epochs,
        "batch_size": int(full.batch_size),  # type: ignore[arg-type]
        "lr": float(full.lr),  # type: ignore[arg-type]
        "seed": config.seed,
        "init": init,
        "seconds": seconds,
        "perplexity": {
            "members": document_perplexity(trained, corpus.texts(members), context),
            "heldout": document_perplexity(trained, corpus.texts(heldout), context),
        },
        "documents": {"members": len(members), "heldout": len(heldout)},
        "history": [
            {"epoch": r.epoch, "train_loss": r.train_loss, "eval_loss": r.eval_loss}
            for r in result.history
        ],
    }
    save_model(trained.cpu(), folder, spec, metadata={"language": language})
    return language


def load_language_model(folder: str | Path, *, device: str = "cpu") -> LoadedLM:
    """The model folder written by `train_language_model` (or `privacylab lm train`); LMError
    with one line when it is not one."""
    path = Path(folder)
    if not path.is_dir():
        raise LMError(f"no language-model folder at {path}")
    try:
        model, spec, metadata = load_model(path, device=device)
    except ModelError as error:
        raise LMError(str(error)) from None
    if spec.name != "gpt" or not isinstance(model, CausalLM):
        raise LMError(f"{path} holds a {spec.name!r} model, not a language model (gpt)")
    if not (path / CORPUS_FILE).is_file():
        raise LMError(f"{path} has no {CORPUS_FILE}: not a language-model folder")
    try:
        corpus = load_corpus(path)
    except DataError as error:
        raise LMError(str(error)) from None
    return LoadedLM(model=model, spec=spec, metadata=dict(metadata), corpus=corpus)


def language_target(
    folder: str | Path,
    access: str = "scores",
    *,
    device: str = "cpu",
    query_budget: int | None = None,
    loaded: LoadedLM | None = None,
) -> LanguageTarget:
    """The model of `folder` behind the threat model: a `LanguageTarget` with `access` (scores:
    black-box probabilities, Carlini et al. 2021, Sec. 3.1), counting every query. `loaded`:
    the folder already read by `load_language_model` (not read again)."""
    loaded = loaded or load_language_model(folder, device=device)
    return LanguageTarget(
        loaded.model,
        access,
        VOCAB_SIZE,
        context=loaded.context,
        query_budget=query_budget,
        device=device,
    )


def folder_digest(*folders: str | Path | None) -> str:
    """sha256 of the weights, sidecar and corpus of each model folder (None: no model), in
    order: what a stored generation or attack result was computed on, so that a re-run on
    another model never resumes from it."""
    digest = hashlib.sha256()
    for folder in folders:
        digest.update(b"\0folder\0" if folder is not None else b"\0none\0")
        if folder is None:
            continue
        for name in (WEIGHTS_FILE, SIDECAR_FILE, CORPUS_FILE):
            path = Path(folder) / name
            if path.is_file():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def target_facts(folder: str | Path, loaded: LoadedLM | None = None) -> dict[str, Any]:
    """What a report says about the target model of `folder`: {"folder", "size", "parameters",
    "private", "epsilon", "perplexity"} (plus delta, accountant, epochs, context, and
    "pretrained": the name of the init folder it was fine-tuned from, or None). `loaded`: the
    folder already read by `load_language_model` (not read again)."""
    loaded = loaded or load_language_model(folder)
    language = loaded.language
    return {
        "folder": str(Path(folder)),
        "size": language.get("size"),
        "parameters": language.get("parameters", _parameters(loaded.model)),
        "private": bool(language.get("private", False)),
        "epsilon": language.get("epsilon"),
        "delta": language.get("delta"),
        "accountant": language.get("accountant"),
        "epochs": language.get("epochs"),
        "context": language.get("context", loaded.context),
        "perplexity": language.get("perplexity"),
        "pretrained": Path(language["init"]["folder"]).name if language.get("init") else None,
    }
