"""The DP-Forward job: fine-tune an encoder on the review corpus non-privately, with DP-SGD or
with DP-Forward, on the same data, and write the model folder the embedding attacks read.

Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on Language Models with Differential
Privacy in Forward Pass", CCS'23) compare three ways to fine-tune BERT (Sec. 5.4, Table 5):

- ``non-private``: plain fine-tuning of the encoder and a linear head (mean pooling);
- ``dp-sgd``: DP-SGD (Abadi et al. 2016, Alg. 1) through the one trainer with Poisson sampling
  and ghost clipping (Li et al. 2022), central DP of the pair (X, y) at (ε, δ), PLD-accounted;
- ``dp-forward``: the one trainer with a non-private optimiser; the model's release layer
  (`privacylab.training.dpforward.ForwardNoise`) normalises f(X) at the cut (input, layer:K or
  output) to Frobenius norm C and adds aMGM noise calibrated for sensitivity 2C and `epochs`
  releases per sequence (one with `frozen`), in training and at inference (SeqLDP, Sec. 3.3);
  with `label_epsilon` the training labels are randomized once (k-ary RR, Sec. 3.4).

Data: `privacylab.data.reviews` (train = members, fine-tuned on; test = non-members, the
accuracy; aux = the attacker's). Encoders: ``minilm`` (all-MiniLM-L6-v2, the real pretrained
encoder that ships offline, optionally its first `layers` layers) or ``tiny`` (a random small
BERT built by `privacylab.models.minilm.tiny_bert` with the run's seed, for tests).

Default learning rates (Adam): 5e-5 without DP-SGD (BERT fine-tuning's usual rate, Devlin et
al. 2019; the paper's, Sec. 5.1), 5e-4 under DP-SGD (Li et al. 2022, Sec. 3: DP fine-tuning
needs a larger rate with a small clipping norm, `DP_SGD_CLIP` = 0.1). The batch size is the same
for all three (the paper's comparison at equal batches).

Measured (all-MiniLM-L6-v2, 2,400 reviews: 960 members, 720 non-members, max_len 48, batch 32,
δ = 1e-5, one CPU thread on a shared 2-core machine, so seconds are only indicative): test
accuracy non-private 0.928 (3 epochs, 3.7 s/step); DP-SGD ε = 8 (σ 0.60, PLD ε 7.99) 0.674
(5.7 s/step); DP-Forward ε = 8 at output 0.656 (3 epochs, 3.4 s/step), 0.674 (1 epoch), 0.639
with --reduce 16 (3 epochs); at layer:3 0.503 (chance: a 48 × 384 matrix of norm 1 under noise
of std 2.08 per entry). Noisy inference caps DP-Forward's binary accuracy at
`privacylab.training.dpforward.release_accuracy_bound` = Φ(C/σ): 0.685 for 3 epochs at ε = 8
(0.657 with the corpus's 15% mixed reviews, whose labels are random), 0.798 for 1 epoch; the
3-epoch output run sits at that cap. With the released code's sensitivity of 1 instead of 2C the
cap would be higher only because the noise would be half of what ε requires.

A model folder: `model.safetensors` (weights, with the noise layer's call counter) and
`model.json` {"config", "encoder" (BERT config), "num_classes", "facts"}, `reviews.json` (the
corpus and its splits) and `checkpoint/` (the trainer's resumable state and `config.json`, the
options the run was started with). A killed run re-run with the same options resumes from the
last finished epoch to the same weights; a finished folder is reported as it is; a folder of
other options is refused with one line.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.errors import PrivacylabError

__all__ = [
    "DEFAULT_LR",
    "DP_SGD_CLIP",
    "DP_SGD_LR",
    "ENCODERS",
    "METHODS",
    "DPForwardConfig",
    "DPForwardError",
    "LoadedForward",
    "forward_config",
    "forward_facts",
    "load_dpforward",
    "train_dpforward",
]

METHODS = ("dp-forward", "dp-sgd", "non-private")
ENCODERS = ("minilm", "tiny")
MINILM_LAYERS = 6
TINY_LAYERS = 2
MAX_LEN_LIMIT = 512
"""BERT's position embeddings (MiniLM's 512)."""

DEFAULT_LR = 5e-5
DP_SGD_LR = 5e-4
DP_SGD_CLIP = 0.1
"""Per-example gradient clipping norm of the DP-SGD baseline (Li et al. 2022, Sec. 3.1)."""

WEIGHTS_FILE = "model.safetensors"
SIDECAR_FILE = "model.json"
CHECKPOINT_DIR = "checkpoint"
CLAIM_FILE = "config.json"
FORMAT = "privacylab-dpforward/1"
MAX_SIDECAR_BYTES = 16 * 1024**2

Progress = Callable[[str, float, float], None]


class DPForwardError(PrivacylabError, ValueError):
    """A bad DP-Forward option or model folder; the message is one line."""


def _number(name: str, value: object, *, low: float = 0.0, high: float = math.inf) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DPForwardError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or not low < number <= high:
        bound = f"in ({low:g}, {high:g}]" if math.isfinite(high) else f"> {low:g}"
        raise DPForwardError(f"{name} must be a finite number {bound}, got {value!r}")
    return number


def _whole(name: str, value: object, low: int = 1, high: int = 10**7) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DPForwardError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True)
class DPForwardConfig:
    """How to fine-tune (module docstring). `epsilon` is the target ε of DP-Forward (SeqLDP of
    a training sequence over all epochs) or of DP-SGD (central); ignored (None) for
    non-private. `lr` None: `DEFAULT_LR`, or `DP_SGD_LR` for dp-sgd. `layers` None: the
    encoder's full depth (MiniLM 6, tiny 2). `reduce` = d′ (dp-forward only): release an
    r × d′ matrix through the trainable maps M1/M2 of Du et al. 2023, Sec. 3.2 (None: r × d).
    `frozen` (dp-forward only): f(·) stays the pretrained one and each training sequence is
    released ONCE; the provider trains p(·) for every epoch on those releases (post-processing,
    Du et al. 2023, Sec. 3.3: "unless f is frozen to re-use f(X) + Z"), so ε is that of one
    release instead of `epochs` and the noise is √epochs smaller. With `reduce`, M1 (user side)
    stays at its seeded initial map and M2 (provider side) is trained with p(·)."""

    method: str = "dp-forward"
    epsilon: float | None = 8.0
    delta: float = 1e-5
    position: str = "output"
    clip: float = 1.0
    label_epsilon: float | None = None
    epochs: int = 3
    batch_size: int = 32
    lr: float | None = None
    max_len: int = 48
    layers: int | None = None
    encoder: str = "minilm"
    documents: int = 2400
    seed: int = 0
    device: str = "cpu"
    reduce: int | None = None
    frozen: bool = False

    @property
    def releases(self) -> int:
        """How many times DP-Forward releases each training sequence: 1 when `frozen`, else
        once per epoch."""
        return 1 if self.frozen else self.epochs

    @property
    def depth(self) -> int:
        """The number of encoder layers used."""
        if self.layers is not None:
            return self.layers
        return MINILM_LAYERS if self.encoder == "minilm" else TINY_LAYERS

    def validate(self) -> DPForwardConfig:
        """This config with its defaults resolved (non-private: no ε; lr per method; position
        normalised), or a one-line DPForwardError naming the first bad option."""
        from privacylab.models.encoder import parse_position
        from privacylab.models.errors import ModelError

        if self.method not in METHODS:
            raise DPForwardError(f"unknown method {self.method!r}; choose {', '.join(METHODS)}")
        if self.encoder not in ENCODERS:
            raise DPForwardError(f"unknown encoder {self.encoder!r}; choose {', '.join(ENCODERS)}")
        private = self.method != "non-private"
        if self.epsilon is not None:
            _number("epsilon", self.epsilon)
        elif private:
            raise DPForwardError(f"{self.method} needs a target epsilon")
        delta = _number("delta", self.delta)
        if delta >= 1.0:
            raise DPForwardError(f"delta must be in (0, 1), got {self.delta!r}")
        _number("clip C", self.clip)
        if self.label_epsilon is not None:
            _number("label epsilon", self.label_epsilon)
            if self.method != "dp-forward":
                raise DPForwardError(
                    "label epsilon (randomized response of the labels) is for dp-forward; "
                    f"{self.method} does not use it"
                )
        if self.reduce is not None:
            _whole("reduce", self.reduce, 1, 100_000)
            if self.method != "dp-forward":
                raise DPForwardError(
                    f"reduce (the released width d') is for dp-forward, not {self.method}"
                )
        if not isinstance(self.frozen, bool):
            raise DPForwardError(f"frozen must be true or false, got {self.frozen!r}")
        if self.frozen and self.method != "dp-forward":
            raise DPForwardError(
                f"frozen (one release per training sequence) is for dp-forward, not {self.method}"
            )
        if self.layers is not None:
            high = MINILM_LAYERS if self.encoder == "minilm" else 48
            _whole("layers", self.layers, 1, high)
        try:
            position = str(parse_position(str(self.position), self.depth))
        except ModelError as error:
            raise DPForwardError(str(error)) from None
        _whole("epochs", self.epochs, 1, 10_000)
        _whole("batch size", self.batch_size, 1, 1_000_000)
        if self.lr is not None:
            _number("learning rate", self.lr, high=1e3)
        _whole("max_len", self.max_len, 3, MAX_LEN_LIMIT)
        _whole("documents", self.documents, 24, 200_000)
        _whole("seed", self.seed, 0, 2**31 - 1)
        if not isinstance(self.device, str) or not self.device.strip():
            raise DPForwardError(f"device must be a name such as cpu or cuda, got {self.device!r}")
        default_lr = DP_SGD_LR if self.method == "dp-sgd" else DEFAULT_LR
        return replace(
            self,
            epsilon=float(self.epsilon) if private and self.epsilon is not None else None,
            delta=float(self.delta),
            position=position,
            clip=float(self.clip),
            label_epsilon=None if self.label_epsilon is None else float(self.label_epsilon),
            lr=float(self.lr) if self.lr is not None else default_lr,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`from_dict` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DPForwardConfig:
        """The config `to_dict` wrote (unknown keys refused), validated."""
        if not isinstance(data, Mapping):
            raise DPForwardError("a DP-Forward config must be a JSON object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise DPForwardError(f"unknown DP-Forward config key {unknown[0]!r}")
        return cls(**dict(data)).validate()

    def training_options(self) -> dict[str, Any]:
        """The options that decide the trained weights (the device does not)."""
        return {k: v for k, v in self.to_dict().items() if k != "device"}


@dataclass
class LoadedForward:
    """A model folder read back: the classifier (eval mode; for dp-forward its release layer
    adds the noise at inference), MiniLM's tokenizer, the review corpus, the config and the
    facts of the run."""

    model: Any
    tokenizer: Any
    reviews: Any
    config: DPForwardConfig
    facts: dict[str, Any]


def _encoder(config: DPForwardConfig) -> nn.Module:
    from privacylab.models.minilm import load_minilm, tiny_bert

    if config.encoder == "minilm":
        return load_minilm(layers=config.layers)
    return tiny_bert(layers=config.depth, max_len=config.max_len, seed=config.seed)


def _release(config: DPForwardConfig, dim: int) -> nn.Module | None:
    """The DP-Forward release layer of `config` (None for the other methods)."""
    from privacylab.models.encoder import parse_position
    from privacylab.training.dpforward import ForwardNoise, forward_mechanism

    if config.method != "dp-forward":
        return None
    assert config.epsilon is not None
    rows = 1 if parse_position(config.position, config.depth).pooled else config.max_len
    columns = dim if config.reduce is None else config.reduce
    mechanism = forward_mechanism(
        config.epsilon, config.delta, config.clip, rows, columns, releases=config.releases
    )
    return ForwardNoise(config.clip, mechanism, seed=config.seed, reduce=config.reduce, dim=dim)


def _classifier(config: DPForwardConfig, encoder: nn.Module) -> Any:
    from privacylab.models.encoder import EncoderClassifier
    from privacylab.models.errors import ModelError

    if config.max_len > int(encoder.config.max_position_embeddings):  # type: ignore[union-attr]
        raise DPForwardError(
            f"max_len {config.max_len} exceeds the encoder's "
            f"{encoder.config.max_position_embeddings} positions"  # type: ignore[union-attr]
        )
    dim = int(encoder.config.hidden_size)  # type: ignore[union-attr]
    try:
        return EncoderClassifier(
            encoder,
            2,
            position=config.position,
            release=_release(config, dim),
            seed=config.seed,
        )
    except ModelError as error:
        raise DPForwardError(str(error)) from None


class _StepClock:
    """Seconds per optimizer step, measured between consecutive steps of an epoch (the
    trainer's setup and per-epoch evaluation are left out; with one step per epoch, the time
    from the epoch's start to its step)."""

    def __init__(self, device: str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.mark = 0.0
        self.last: float | None = None
        self.inside: list[float] = []
        self.first: list[float] = []

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        self.mark, self.last = self._now(), None

    def on_step_end(self, state: Any) -> None:
        now = self._now()
        if self.last is None:
            self.first.append(now - self.mark)
        else:
            self.inside.append(now - self.last)
        self.last = now

    def on_epoch_end(self, state: Any) -> None:
        self.start()

    @property
    def seconds_per_step(self) -> float | None:
        times = self.inside or self.first
        return float(np.mean(times)) if times else None


def _claim(folder: Path, config: DPForwardConfig) -> None:
    """Record the run's options in `checkpoint/config.json` before training, or DPForwardError
    when the folder holds a run of other options."""
    path = folder / CHECKPOINT_DIR / CLAIM_FILE
    wanted = config.training_options()
    if path.is_file():
        try:
            earlier = _with_defaults(json.loads(path.read_text()))
        except (OSError, ValueError):
            earlier = None
        if earlier != wanted:
            raise DPForwardError(_other_options(folder, earlier, wanted))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(wanted, sort_keys=True))
    partial.replace(path)


def _with_defaults(earlier: object) -> object:
    """The training options a folder recorded, with the options added since it was written
    (absent there) at their defaults, which is what they meant then (`from_dict` reads them
    so)."""
    if not isinstance(earlier, dict):
        return earlier
    defaults = DPForwardConfig().training_options()
    return {**defaults, **{k: v for k, v in earlier.items() if k != "device"}}


def _other_options(folder: Path, earlier: object, wanted: dict[str, Any]) -> str:
    if isinstance(earlier, dict):
        for key, value in wanted.items():
            if earlier.get(key) != value:
                return (
                    f"{folder} holds a run with {key}={earlier.get(key)!r}, not {value!r}; use "
                    "another output folder or delete it"
                )
    return f"{folder} holds a run of other options; use another output folder or delete it"


def _read_sidecar(folder: Path) -> dict[str, Any]:
    path = folder / SIDECAR_FILE
    try:
        if path.stat().st_size > MAX_SIDECAR_BYTES:
            raise DPForwardError(f"{path} is larger than {MAX_SIDECAR_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DPForwardError(
            f"no DP-Forward model at {folder} (no {SIDECAR_FILE}); write one with "
            "`privacylab dpforward train`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        line = (str(error).splitlines() or [type(error).__name__])[0]
        raise DPForwardError(f"cannot read {path}: {line}") from None
    keys = ("format", "config", "encoder", "num_classes", "facts")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DPForwardError(f"{path} is not a DP-Forward model sidecar ({FORMAT})")
    missing = [k for k in keys if k not in data]
    if missing:
        raise DPForwardError(f"{path} lacks {missing[0]!r}")
    return data


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    from privacylab.report.jsonable import json_ready

    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(json_ready(payload), allow_nan=False, indent=1))
    partial.replace(path)


class _PostNoise(nn.Module):
    """The provider's side of `model` alone, trained on releases computed once
    (`DPForwardConfig.frozen`): M2 when reducing (`ForwardNoise.provider_side`), then p(·)
    (`EncoderClassifier.after`); its input is the released matrix, its output the logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, released: torch.Tensor) -> torch.Tensor:
        lifted = self.model.release.provider_side(released)  # type: ignore[union-attr,operator]
        return self.model.after(lifted)  # type: ignore[operator]


@torch.no_grad()
def _released(model: nn.Module, ids: torch.Tensor, device: str, chunk: int = 128) -> torch.Tensor:
    """One release per sequence of `ids`, what its user sends (`ForwardNoise.user_side` of
    f(X): eval mode, f(·) and M1 frozen at their initial weights), on the CPU. The noise
    layer's seeded call counter makes a re-run (a resumed training) draw the same releases."""
    model.to(device).eval()
    send = model.release.user_side  # type: ignore[union-attr]
    out = [
        send(model.before(ids[i : i + chunk].to(device))).cpu()  # type: ignore[operator]
        for i in range(0, len(ids), chunk)
    ]
    return torch.cat(out) if out else torch.zeros(0)


def _accuracy(model: nn.Module, ids: torch.Tensor, labels: np.ndarray, device: str) -> float:
    """Accuracy of the deployed pipeline (eval mode; noisy for dp-forward)."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(ids), 256):
            logits = model(ids[i : i + 256].to(device))
            correct += int((logits.argmax(-1).cpu().numpy() == labels[i : i + 256]).sum())
    return correct / max(1, len(ids))


def _finished(folder: Path, config: DPForwardConfig) -> dict[str, Any] | None:
    if not (folder / SIDECAR_FILE).is_file():
        return None
    data = _read_sidecar(folder)
    earlier = data["config"]
    saved = _with_defaults(earlier) if isinstance(earlier, dict) else 0
    if saved != config.training_options():
        raise DPForwardError(_other_options(folder, saved, config.training_options()))
    if not (folder / WEIGHTS_FILE).is_file():
        raise DPForwardError(f"{folder} has {SIDECAR_FILE} but no {WEIGHTS_FILE}")
    return dict(data["facts"])


def train_dpforward(
    config: DPForwardConfig,
    out: str | Path,
    *,
    progress: Progress | None = None,
    callbacks: Iterable[Any] = (),
) -> dict[str, Any]:
    """Fine-tune by `config.method` (module docstring) and write the model folder `out`;
    returns the facts (also in model.json). Resumable: a re-run with the same options resumes
    a killed run from its last finished epoch, and a finished folder is returned as is.
    `progress(stage, done, total)` after each epoch; `callbacks` go to the trainer (they may
    stop it; a stopped run writes no model and raises DPForwardError)."""
    from privacylab.data.reviews import ReviewConfig, build_reviews, load_reviews, save_reviews
    from privacylab.models.minilm import encode_texts, encoder_config, load_tokenizer
    from privacylab.training import PrivacyConfig, TrainConfig, TrainingError, train
    from privacylab.training.dpforward import forward_privacy, private_labels

    if not isinstance(config, DPForwardConfig):
        raise DPForwardError(f"train_dpforward needs a DPForwardConfig, got {type(config)}")
    config = config.validate()
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise DPForwardError(f"{folder} exists and is not a folder")
    done = _finished(folder, config)
    if done is not None:
        return done
    _claim(folder, config)
    reviews = build_reviews(ReviewConfig(documents=config.documents, seed=config.seed))
    if (folder / "reviews.json").is_file():
        if load_reviews(folder).to_dict() != reviews.to_dict():
            raise DPForwardError(f"{folder} holds another review corpus; use another folder")
    else:
        save_reviews(reviews, folder)
    members, non_members = reviews.subset("train"), reviews.subset("test")
    tokenizer = load_tokenizer()
    x_train = encode_texts(tokenizer, members.texts, config.max_len)
    x_test = encode_texts(tokenizer, non_members.texts, config.max_len)
    y_true = np.asarray(members.labels, dtype=np.int64)
    label_event = None
    y_train = y_true
    if config.label_epsilon is not None:
        y_train, label_event = private_labels(y_true, config.label_epsilon, 2, config.seed)
    encoder = _encoder(config)
    model = _classifier(config, encoder)
    privacy = None
    if config.method == "dp-sgd":
        privacy = PrivacyConfig(
            epsilon=config.epsilon,
            delta=config.delta,
            max_grad_norm=DP_SGD_CLIP,
            clipping="ghost",
            sampling="poisson",
            accountant="pld",
        )
    train_config = TrainConfig(
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=float(config.lr),  # type: ignore[arg-type]
        optimizer="adam",
        seed=config.seed,
        device=config.device,
        privacy=privacy,
    )
    stage = f"{config.method} {config.position}" + (
        f" eps={config.epsilon:g}" if config.epsilon is not None else ""
    )

    def report(record: Any) -> None:
        if progress is not None:
            progress(stage, float(record.epoch), float(config.epochs))

    clock = _StepClock(config.device)
    if progress is not None:
        progress(stage, 0.0, float(config.epochs))
    start = time.perf_counter()
    learner: nn.Module = model
    if config.frozen:
        learner = _PostNoise(model)
        x_train = _released(model, x_train, config.device)
        x_test = _released(model, x_test, config.device)
    clock.start()
    try:
        result = train(
            learner,
            (x_train, torch.as_tensor(y_train)),
            train_config,
            eval_data=(x_test, torch.as_tensor(non_members.labels)),
            checkpoint_dir=folder / CHECKPOINT_DIR,
            progress=report,
            callbacks=(clock, *callbacks),
        )
    except TrainingError as error:
        raise DPForwardError(str(error)) from None
    seconds = time.perf_counter() - start
    if result.stopped:
        raise DPForwardError(f"training stopped ({result.stopped}); re-run to resume")
    trained = result.model.model if config.frozen else result.model
    last = result.history[-1]
    train_accuracy = last.train_accuracy
    if label_event is not None:
        train_accuracy = _accuracy(result.model, x_train, y_true, config.device)
    event = accountant = epsilon = spent = None
    if config.method == "dp-forward":
        mechanism = trained.release.mechanism
        spent = forward_privacy(
            mechanism,
            clip=config.clip,
            delta=config.delta,
            releases=config.releases,
            label_event=label_event,
            users=len(members),
        ).to_dict()
        epsilon, event, accountant = spent["epsilon"], spent["event"], spent["accountant"]
    elif result.privacy is not None:
        spent = asdict(result.privacy)
        epsilon, event, accountant = spent["epsilon"], spent["event"], spent["accountant"]
    facts = {
        "method": config.method,
        "position": config.position,
        "frozen": config.frozen,
        "encoder": config.encoder,
        "layers": config.depth,
        "epsilon": epsilon,
        "delta": config.delta if config.method != "non-private" else None,
        "event": event,
        "accountant": accountant,
        "privacy": spent,
        "label_epsilon": config.label_epsilon,
        "accuracy": last.eval_accuracy,
        "train_accuracy": train_accuracy,
        "members": len(members),
        "non_members": len(non_members),
        "epochs": config.epochs,
        "seconds": seconds,
        "seconds_per_step": clock.seconds_per_step,
        "folder": str(folder),
    }
    from safetensors.torch import save_file

    weights = {k: v.detach().cpu().contiguous() for k, v in trained.state_dict().items()}
    partial = folder / (WEIGHTS_FILE + ".partial")
    save_file(weights, str(partial))
    partial.chmod(0o644)
    partial.replace(folder / WEIGHTS_FILE)
    sidecar = {
        "format": FORMAT,
        "config": config.to_dict(),
        "encoder": encoder_config(trained.encoder),
        "num_classes": 2,
        "facts": facts,
    }
    _write_json(folder / SIDECAR_FILE, sidecar)
    return _read_sidecar(folder)["facts"]


def forward_config(folder: str | Path) -> DPForwardConfig:
    """The validated config the model folder `folder` was trained with (its sidecar only: no
    weights are read)."""
    return DPForwardConfig.from_dict(_read_sidecar(Path(folder))["config"])


def forward_facts(folder: str | Path) -> dict[str, Any]:
    """The facts of the model folder `folder` (as `train_dpforward` returned them)."""
    return dict(_read_sidecar(Path(folder))["facts"])


def load_dpforward(folder: str | Path, *, device: str = "cpu") -> LoadedForward:
    """The model folder written by `train_dpforward`, read back without pickles (safetensors
    and JSON); DPForwardError with one line when it is not one."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from privacylab.data.reviews import load_reviews
    from privacylab.models.errors import ModelError
    from privacylab.models.minilm import encoder_from_config, load_tokenizer

    path = Path(folder)
    if not path.is_dir():
        raise DPForwardError(f"no DP-Forward model folder at {path}")
    data = _read_sidecar(path)
    config = DPForwardConfig.from_dict(data["config"])
    if data["num_classes"] != 2 or not isinstance(data["encoder"], dict):
        raise DPForwardError(f"{path / SIDECAR_FILE} is malformed (num_classes or encoder)")
    try:
        encoder = encoder_from_config(data["encoder"])
    except ModelError as error:
        raise DPForwardError(f"{path / SIDECAR_FILE}: {error}") from None
    model = _classifier(config, encoder)
    try:
        weights = load_file(str(path / WEIGHTS_FILE))
        model.load_state_dict(weights, strict=True)
    except FileNotFoundError:
        raise DPForwardError(f"{path} has no {WEIGHTS_FILE}") from None
    except (SafetensorError, RuntimeError, OSError) as error:
        line = (str(error).splitlines() or [type(error).__name__])[0][:200]
        raise DPForwardError(f"cannot load {path / WEIGHTS_FILE}: {line}") from None
    model.to(device).eval()
    return LoadedForward(
        model=model,
        tokenizer=load_tokenizer(),
        reviews=load_reviews(path),
        config=replace(config, device=device),
        facts=dict(data["facts"]),
    )
