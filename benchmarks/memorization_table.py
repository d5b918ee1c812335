"""Song, Ristenpart & Shmatikov (CCS 2017, "Machine Learning Models that Remember Too Much")
on our data: every registered memorization attack at two or three strengths on mnist5k, beside
the numbers the paper reports, with the honest model as the named peer.

Setting (the job's default, `privacylab attack memorization`): mnist5k split by one seeded
permutation into 1,000 test rows, the holder's 3,500 training rows X and the next 300 rows held out
(the job's 300 held-out clean rows, where the query detector's threshold is set); the victim recipe
(`VictimRecipe()`: the 784-512-256-10 ReLU MLP, 535,818 parameters, Adam 2e-3, 20 epochs,
batch 64); the secret = the first `items` rows of a seeded permutation of X (seed = the run's
seed), pixels quantised to `value_bits` bits. For each (method, setting) one model is trained
by the attack's malicious training (`train_encoded`), decoded by the attack's decoder through a
`Target` at its declared access (`run_memorization`, the training set as the candidates an
item must be told apart from), and the *same decoder* is run on the honest model of the same
seed — the peer: no maintained tool implements these attacks (the authors' code is a research
snapshot, not a tool), so the baseline is what the decoder reads from a model that hides
nothing, which must be chance (bit accuracy ~1/2, no item recovered).

Columns: honest and encoded test accuracy and their difference, items recovered / items
(decoded nearer to the original than to any other training row), bit accuracy, MAE and PSNR of
the decoded images, queries (black-box) and recovered bits (bits × (1 − h(bit error))) per
parameter or per query; then the honest model's decode; then the CPU-seconds of the malicious
training against the honest training (one thread each, `time.process_time`). Song et al.'s
reported numbers follow in a second table, as constants with their table number, and the
ratios ours/theirs where a quantity is comparable (accuracy change, decode quality).

Models are cached under `--store` (safetensors + JSON sidecar per (role, method, setting,
seed), `privacylab.models.save_model`; trainer checkpoints while one trains), results as one
JSON file per row: a killed run resumes and a re-run trains nothing already stored. The
helpers here (split, secret, cached training, decoding) are shared by
`memorization_checks.py` and `memorization_dp.py`.

    OMP_NUM_THREADS=1 python benchmarks/memorization_table.py --store /work/bench18/h6 [--seeds 0]
        [--methods lsb correlation sign capacity] [--quick] [--json]

Measured (seed 0, one thread per process, 2-core machine shared with other work; the honest
model's test accuracy is 0.925; `t/t_hon` is CPU-seconds of the malicious training over the
honest training's, 10.0 CPU-s; `hon bit` the decoder's bit accuracy on the honest model):

    method      setting            acc enc  recov     bit acc PSNR  bit/par bit/qry hon bit t/t_hon
    lsb         b=8                  0.925   683/683   1.000 100.0   7.995       -   0.501    1.25
    lsb         b=16                 0.925 1366/1366   1.000 100.0  15.990       -   0.501    1.06
    lsb         b=20                 0.925 1708/1708   1.000 100.0  19.993       -   0.501    1.11
    correlation λ=0.3                0.941   100/100   0.927  54.4   0.727       -   0.501    1.58
    correlation λ=1                  0.939   100/100   0.992  85.8   1.092       -   0.501    1.33
    correlation λ=3                  0.941   100/100   0.987  82.9   1.055       -   0.501    1.38
    correlation λ=1 fill             0.921   660/683   0.566  13.1   0.100       -   0.500    1.87
    correlation λ=3 fill             0.932   681/683   0.609  17.5   0.276       -   0.500    1.88
    sign        λ=30                 0.937     40/40   1.000  89.6   0.234       -   0.515    1.49
    sign        λ=100                0.939     40/40   1.000  94.3   0.234       -   0.515    1.42
    sign        λ=300                0.936     40/40   1.000  98.7   0.234       -   0.515    1.39
    sign        λ=100 fill           0.947   170/170   0.987  27.7   0.896       -   0.509    1.89
    sign        λ=300 fill           0.947   170/170   0.997  42.7   0.966       -   0.509    1.91
    capacity    1-bit x16 pixel      0.941     16/16   1.000 100.0       -    3.00   0.436    2.23
    capacity    4-bit x4 pixel       0.942       4/4   1.000 100.0       -    3.00   0.437    2.42
    capacity    4-bit x8 r=4 pixel   0.947       8/8   1.000 100.0       -    3.00   0.434    3.18
    capacity    4-bit x4 noise       0.942       0/4   0.870   9.8       -    1.33   0.403    2.37

(`fill`: as many items as the model holds, every parameter carrying the secret, as Song et
al. run it: 683 8-bit images for correlation, 170 4-bit images for sign; the other rows hide
the job's default secrets, 100 8-bit images for correlation and 40 4-bit images for sign;
capacity rows use ratio 2 unless `r=4`.) What reproduces Song et al.'s shape: LSB recovers
every image exactly at every b with test predictions unchanged (the released weights differ
from the honest ones by < 2^(b-23) relatively); correlation and sign recover recognisable
images (items nearer their own original than any other training row) and capacity abuse
recovers its images exactly from label queries (3 bits per query) with the pixel generator
(the noise generator's inputs are not learnt: bit accuracy 0.87 is the secret's share of 0
bits, no image recognisable). What does not: the encoded models' accuracy is not below
the honest model's. At seed 0 it is 1 to 2 points above (seed 0's honest model, 0.925, is the
lowest of seeds 0..19: mean 0.946, max 0.960); over seeds 0, 1, 2 the job's default encodings
change accuracy by +0.000 (lsb), +0.009 (correlation), +0.006 (sign), +0.006 (capacity) — the
penalties act as regularisers on an MLP larger than 3,500 rows need, and no cost that grows
with λ is visible in one seed. At fill, correlation decoding degrades instead (bit accuracy
0.57-0.61, PSNR 13-18: recognisable but noisy). Items count as recovered when decoded nearer
to their own original than to any other training row, compared at the secret's
quantisation. The decoders on the honest model of the same seed (the peer) read chance: bit
accuracy 0.50
(capacity: 0.40-0.44, the agreement of an honest model's near-constant labels with the
secret's mostly-zero bits) and no item recovered (one LSB noise image at b=16 lands nearest
its own original by chance, of 1,366).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privacylab.attacks.memorization import base as mem
from privacylab.attacks.memorization.training import train_encoded, train_honest
from privacylab.attacks.poisoning.recipe import VictimRecipe
from privacylab.data import Dataset, load_dataset
from privacylab.target import Target

TEST, TRAIN, HOLDOUT = 1000, 3500, 300
DEFAULT_STORE = "/work/bench18/h6"


def log(message: str) -> None:
    """Progress on stderr."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data, secret, models


@dataclass(frozen=True)
class Split:
    """The rows of one seed: the holder's training set, the test set, held-out clean rows."""

    train: Dataset
    test: Dataset
    held: Dataset
    seed: int


def split(seed: int, train_size: int = TRAIN, test_size: int = TEST) -> Split:
    """mnist5k by one seeded permutation: test rows first, then training rows, the rest held out."""
    data = load_dataset("mnist5k")
    order = np.random.default_rng(seed).permutation(len(data))
    cut = test_size + train_size
    return Split(
        data.subset(order[test_size:cut]),
        data.subset(order[:test_size]),
        data.subset(order[cut : cut + HOLDOUT]),
        seed,
    )


def secret_for(train: Dataset, seed: int, items: int, value_bits: int) -> mem.Secret:
    """The job's secret: the first `items` rows of a seeded permutation of the training set."""
    rows = np.random.default_rng(seed).permutation(len(train))[:items]
    return mem.choose_secret(train, rows, value_bits)


def accuracy(model: nn.Module, data: Dataset) -> float:
    """Test accuracy (evaluation, not a counted query)."""
    model.eval()
    with torch.no_grad():
        predicted = torch.cat(
            [model(data.features[i : i + 1024]).argmax(1) for i in range(0, len(data), 1024)]
        )
    return float((predicted == data.labels).float().mean())


class Store:
    """The benchmark folder: `models/<key>/` (save_model), `results/<group>/<key>.json`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        (self.root / "models").mkdir(parents=True, exist_ok=True)
        (self.root / "results").mkdir(parents=True, exist_ok=True)
        (self.root / "locks").mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """An exclusive lock on `key` (two scripts never train the same model at once)."""
        with open(self.root / "locks" / f"{key}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def result(self, group: str, key: str) -> dict[str, Any] | None:
        path = self.root / "results" / group / f"{key}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def put(self, group: str, key: str, value: dict[str, Any]) -> dict[str, Any]:
        folder = self.root / "results" / group
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.json.tmp"
        tmp.write_text(json.dumps(value, indent=1, default=_json_default))
        os.replace(tmp, folder / f"{key}.json")
        return value

    def results(self, group: str) -> list[dict[str, Any]]:
        folder = self.root / "results" / group
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]

    def cached(
        self,
        key: str,
        data: Dataset,
        recipe: VictimRecipe,
        build: Callable[[Path], tuple[nn.Module, dict[str, Any]]],
    ) -> tuple[nn.Module, dict[str, Any]]:
        """The model stored under `key`, or `build(checkpoint_dir)` trained now (CPU-seconds and
        wall-seconds recorded in the sidecar) and stored."""
        from privacylab.models import load_model, save_model

        folder = self.root / "models" / key
        with self.lock(key):
            if (folder / "model.json").is_file():
                model, _, meta = load_model(folder)
                return model.eval(), meta
            checkpoints = self.root / "checkpoints" / key
            log(f"training {key} ...")
            cpu, wall = time.process_time(), time.perf_counter()
            model, summary = build(checkpoints)
            meta = {
                "key": key,
                "cpu_seconds": time.process_time() - cpu,
                "wall_seconds": time.perf_counter() - wall,
                "threads": torch.get_num_threads(),
                "epsilon_spent": (summary.get("privacy") or {}).get("epsilon"),
                "attack_digest": summary.get("attack_digest"),
                "recipe": recipe.to_dict(),
            }
            save_model(model, folder, recipe.spec(data), meta)
            shutil.rmtree(checkpoints, ignore_errors=True)
            log(f"trained {key} in {meta['cpu_seconds']:.0f} CPU-s ({meta['wall_seconds']:.0f} s)")
            return model.eval(), meta


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return str(value)


def _eps_tag(epsilon: float | None) -> str:
    return "inf" if epsilon is None else f"{epsilon:g}"


def honest(
    store: Store, rows: Split, recipe: VictimRecipe, tag: str = ""
) -> tuple[nn.Module, dict[str, Any]]:
    """The honest model of `recipe` on `rows` (cached)."""
    key = f"honest{tag}-eps{_eps_tag(recipe.epsilon)}-s{rows.seed}"
    return store.cached(
        key,
        rows.train,
        recipe,
        lambda ckpt: train_honest(recipe, rows.train, seed=rows.seed, checkpoint_dir=ckpt),
    )


def attack_digest(method: str) -> str:
    """A digest of the code (docstrings left out) `method`'s encoding and decoding run: its
    module, the shared penalty machinery, the base, the trainer glue. A stored decode of
    other code is redone, and a model trained by other code is marked stale."""
    import ast
    import hashlib
    import inspect

    cls = mem.memorization_class(method)
    folder = Path(inspect.getfile(cls)).parent
    digest = hashlib.sha256()
    names = ("base.py", "training.py", "_penalty.py")
    for path in sorted({Path(inspect.getfile(cls)), *(folder / n for n in names)}):
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body[0] = ast.Pass()
            for i, child in enumerate(body if isinstance(body, list) else []):
                if (
                    isinstance(child, ast.Expr)
                    and isinstance(child.value, ast.Constant)
                    and isinstance(child.value.value, str)
                ):
                    body[i] = ast.Pass()
        digest.update(ast.dump(tree).encode())
    return digest.hexdigest()[:10]


def full_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every option of `method` built with `options` (its defaults filled in), so a cached
    model's key does not change meaning when a default changes."""
    built = mem.make_memorization(method, **options).to_dict()
    built.pop("name", None)
    return built


def option_tag(options: dict[str, Any]) -> str:
    """A file-name-safe tag of attack options and secret settings."""
    parts = [f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in sorted(options.items())]
    return "-".join(parts).replace("/", "_").replace(" ", "") or "default"


def encoded(
    store: Store,
    rows: Split,
    recipe: VictimRecipe,
    method: str,
    options: dict[str, Any],
    secret: mem.Secret,
) -> tuple[nn.Module, dict[str, Any], mem.MemorizationAttack]:
    """The model released by `method`'s malicious training hiding `secret` (cached)."""
    attack = mem.make_memorization(method, **options)
    digest = attack_digest(method)
    layout = secret.layout
    tag = option_tag(
        {**full_options(method, options), "items": layout.items, "vb": layout.value_bits}
    )
    key = f"{method}-{tag}-eps{_eps_tag(recipe.epsilon)}-s{rows.seed}"
    model, meta = store.cached(
        key,
        rows.train,
        recipe,
        lambda ckpt: _with_digest(
            digest,
            train_encoded(
                attack,
                secret,
                recipe,
                rows.train,
                seed=rows.seed,
                key=rows.seed,
                checkpoint_dir=ckpt,
            ),
        ),
    )
    meta["stale"] = None if meta.get("attack_digest") is None else meta["attack_digest"] != digest
    if meta["stale"]:
        log(f"{key}: trained by older {method} code ({meta.get('attack_digest')} != {digest})")
    return model, meta, attack


def _with_digest(
    digest: str, trained: tuple[nn.Module, dict[str, Any]]
) -> tuple[nn.Module, dict[str, Any]]:
    model, summary = trained
    return model, {**summary, "attack_digest": digest}


def decode(
    attack: mem.MemorizationAttack,
    model: nn.Module,
    rows: Split,
    secret: mem.Secret,
    *,
    clean_accuracy: float,
    honest_accuracy: float,
    monitor: Any = None,
) -> mem.MemorizationResult:
    """`run_memorization` of `attack` on `model` behind a Target at the attack's access (with a
    query `monitor` if given), the training set as candidates."""
    access = attack.threat_model.access
    target = Target(model, access, rows.train.num_classes)
    if monitor is not None:
        target = target.with_monitor(monitor)
    task = mem.MemorizationTask(
        secret.layout, tuple(rows.train.input_shape), rows.train.num_classes, key=rows.seed
    )
    return mem.run_memorization(
        attack,
        target,
        task,
        secret,
        clean_accuracy=clean_accuracy,
        honest_accuracy=honest_accuracy,
        candidates=rows.train.features.numpy(),
    )


def summary(result: mem.MemorizationResult) -> dict[str, Any]:
    """The result's JSON form (no image arrays)."""
    return {k: v for k, v in result.to_dict().items() if k not in ("threat_model",)}


def fmt(value: Any, spec: str = ".3f") -> str:
    """A table cell; '-' for None/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def method_defaults(method: str) -> tuple[int, int]:
    """(items, pixel bits) of the job's default secret for `method`."""
    from privacylab.memorize import method_defaults as job_defaults

    return job_defaults(method)


def default_option(method: str, name: str) -> Any:
    """The constructor default of option `name` of attack `method`."""
    return getattr(mem.make_memorization(method), name)


def fill_items(method: str, options: dict[str, Any], value_bits: int, rows: Split) -> int:
    """As many whole items as `method` with `options` can hide in the victim model (at most
    the training set)."""
    attack = mem.make_memorization(method, **options)
    model = VictimRecipe().spec(rows.train).build(seed=0)
    per_item = int(np.prod(rows.train.input_shape)) * value_bits
    room = attack.capacity(model, rows.train.num_classes, len(rows.train))
    return int(min(room // per_item, len(rows.train)))


@dataclass(frozen=True)
class Setting:
    """One row of the table: the attack's options and the secret's size (items of
    `value_bits`-bit pixels; items 0 = fill the model's capacity)."""

    method: str
    options: dict[str, Any]
    items: int
    value_bits: int
    label: str

    def resolved(self, rows: Split) -> Setting:
        if self.items:
            return self
        items = fill_items(self.method, self.options, self.value_bits, rows)
        return Setting(self.method, self.options, items, self.value_bits, self.label)


def settings(method: str, quick: bool = False) -> list[Setting]:
    """The strengths / bit settings measured per method (the attacks' defaults among them);
    "fill" rows hide as many items as the model holds (every parameter carries the secret, as
    in Song et al.'s runs)."""
    if method == "lsb":
        bits = [16] if quick else [8, 16, 20]
        return [Setting("lsb", {"bits": b}, 0 if not quick else 20, 8, f"b={b}") for b in bits]
    if method in ("correlation", "sign"):
        strength = float(default_option(method, "strength"))
        scale = [1.0] if quick else [0.3, 1.0, 3.0]
        items, bits = method_defaults(method)
        if quick:
            items = 5
        rows = [
            Setting(method, {"strength": strength * m}, items, bits, f"λ={strength * m:g}")
            for m in scale
        ]
        if not quick:
            rows += [
                Setting(method, {"strength": strength * m}, 0, bits, f"λ={strength * m:g} fill")
                for m in (1.0, 3.0)
            ]
        return rows
    if method == "capacity":
        if quick:
            return [Setting("capacity", {}, 2, 1, "1-bit x2")]
        ratio = float(default_option("capacity", "ratio"))
        gen = str(default_option("capacity", "generator"))
        other = "noise" if gen != "noise" else "pixel"
        items, bits = method_defaults("capacity")
        return [
            Setting("capacity", {}, 16, 1, f"1-bit x16 r={ratio:g} {gen}"),
            Setting("capacity", {}, items, bits, f"{bits}-bit x{items} r={ratio:g} {gen}"),
            Setting("capacity", {"ratio": 2 * ratio}, 8, 4, f"4-bit x8 r={2 * ratio:g} {gen}"),
            Setting(
                "capacity",
                {"generator": other},
                items,
                bits,
                f"{bits}-bit x{items} r={ratio:g} {other}",
            ),
        ]
    options = {}
    return [Setting(method, options, 10, 8, "default")]


def measure(
    store: Store, rows: Split, recipe: VictimRecipe, setting: Setting, group: str
) -> dict[str, Any]:
    """One (setting, seed) row: honest and encoded models, the decode of each (cached)."""
    setting = setting.resolved(rows)
    options = full_options(setting.method, setting.options)
    tag = option_tag({**options, "items": setting.items, "vb": setting.value_bits})
    key = f"{setting.method}-{tag}-eps{_eps_tag(recipe.epsilon)}-s{rows.seed}"
    stored = store.result(group, key)
    if stored is not None and stored.get("attack_digest") == attack_digest(setting.method):
        return stored
    honest_model, honest_meta = honest(store, rows, recipe)
    honest_acc = accuracy(honest_model, rows.test)
    secret = secret_for(rows.train, rows.seed, setting.items, setting.value_bits)
    model, meta, attack = encoded(store, rows, recipe, setting.method, setting.options, secret)
    acc = accuracy(model, rows.test)
    ours = decode(attack, model, rows, secret, clean_accuracy=acc, honest_accuracy=honest_acc)
    peer = decode(
        attack, honest_model, rows, secret, clean_accuracy=honest_acc, honest_accuracy=honest_acc
    )
    row = {
        "key": key,
        "method": setting.method,
        "label": setting.label,
        "options": options,
        "items": setting.items,
        "value_bits": setting.value_bits,
        "seed": rows.seed,
        "epsilon": recipe.epsilon,
        "epsilon_spent": meta.get("epsilon_spent"),
        "honest_epsilon_spent": honest_meta.get("epsilon_spent"),
        "honest_accuracy": honest_acc,
        "accuracy": acc,
        "result": summary(ours),
        "honest_decode": summary(peer),
        "cpu_seconds": meta["cpu_seconds"],
        "honest_cpu_seconds": honest_meta["cpu_seconds"],
        "time_ratio": meta["cpu_seconds"] / max(honest_meta["cpu_seconds"], 1e-9),
        "attack_digest": attack_digest(setting.method),
        "stale_model": meta["stale"],
    }
    log(
        f"{key}: acc {honest_acc:.3f} -> {acc:.3f}, recovered {ours.recovered}/{ours.items}, "
        f"bit acc {ours.bit_accuracy:.3f} (honest model: {peer.bit_accuracy:.3f})"
    )
    return store.put(group, key, row)


def _mean(values: list[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of one (method, setting, ε) over seeds: means (and the seed count)."""
    groups: dict[tuple[str, str, Any], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["method"], row["label"], row.get("epsilon")), []).append(row)
    out = []
    for (method, label, _), members in groups.items():
        res = [m["result"] for m in members]
        peer = [m["honest_decode"] for m in members]
        out.append(
            {
                "method": method,
                "label": label,
                "seeds": [m["seed"] for m in members],
                "options": members[0]["options"],
                "items": members[0]["items"],
                "value_bits": members[0]["value_bits"],
                "epsilon": members[0].get("epsilon"),
                "honest_accuracy": _mean([m["honest_accuracy"] for m in members]),
                "accuracy": _mean([m["accuracy"] for m in members]),
                "accuracy_change": _mean([m["accuracy"] - m["honest_accuracy"] for m in members]),
                "recovered": _mean([r["recovered"] for r in res]),
                "bit_accuracy": _mean([r["bit_accuracy"] for r in res]),
                "exact_match": _mean([r["exact_match"] for r in res]),
                "mae": _mean([r["mae"] for r in res]),
                "psnr": _mean([r["psnr"] for r in res]),
                "queries": _mean([r["queries"] for r in res]),
                "bits_per_parameter": _mean([r["bits_per_parameter"] for r in res]),
                "bits_per_query": _mean([r["bits_per_query"] for r in res]),
                "honest_recovered": _mean([p["recovered"] for p in peer]),
                "honest_bit_accuracy": _mean([p["bit_accuracy"] for p in peer]),
                "honest_mae": _mean([p["mae"] for p in peer]),
                "honest_psnr": _mean([p["psnr"] for p in peer]),
                "time_ratio": _mean([m["time_ratio"] for m in members]),
                "cpu_seconds": _mean([m["cpu_seconds"] for m in members]),
                "honest_cpu_seconds": _mean([m["honest_cpu_seconds"] for m in members]),
                "epsilon_spent": _mean([m.get("epsilon_spent") for m in members]),
            }
        )
    return out


def ours_table(rows: list[dict[str, Any]]) -> str:
    """Our measured rows (means over seeds) as fixed-width text."""
    head = (
        f"{'method':<11} {'setting':<18} {'n':>2} {'acc hon':>7} {'acc enc':>7} {'Δacc':>6} "
        f"{'recov':>9} {'bit acc':>7} {'MAE':>6} {'PSNR':>5} {'queries':>7} {'bit/par':>7} "
        f"{'bit/qry':>7} | {'hon rec':>7} {'hon bit':>7} {'hon PSNR':>8} | {'t/t_hon':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['method']:<11} {r['label']:<18} {len(r['seeds']):>2} "
            f"{fmt(r['honest_accuracy']):>7} {fmt(r['accuracy']):>7} "
            f"{fmt(r['accuracy_change'], '+.3f'):>6} "
            f"{fmt(r['recovered'], '.0f') + '/' + str(r['items']):>9} "
            f"{fmt(r['bit_accuracy']):>7} {fmt(r['mae']):>6} {fmt(r['psnr'], '.1f'):>5} "
            f"{fmt(r['queries'] or None, '.0f'):>7} {fmt(r['bits_per_parameter'], '.3f'):>7} "
            f"{fmt(r['bits_per_query'], '.2f'):>7} | "
            f"{fmt(r['honest_recovered'], '.0f'):>7} {fmt(r['honest_bit_accuracy']):>7} "
            f"{fmt(r['honest_psnr'], '.1f'):>8} | {fmt(r['time_ratio'], '.2f'):>7}"
        )
    return "\n".join(lines)


PARAMETERS = 535_818
"""Parameters of the victim MLP (784·512 + 512 + 512·256 + 256 + 256·10 + 10)."""

SONG_PARAMETERS = 466_900
"""Trainable parameters of the authors' CIFAR-10 ResNet-32 (≈ 0.46M; hand count of
csong27/ml-model-remember's Lasagne model)."""

SONG: list[dict[str, Any]] = [
    {
        "method": "lsb",
        "source": "code",
        "row": "low bits per parameter (default --bits)",
        "theirs": 16,
        "ours": ("b=16", "bits_written"),
    },
    {
        "method": "lsb",
        "source": "derived",
        "row": "accuracy change, |Δθ/θ| < 2^(b-23)",
        "theirs": 0.0,
        "ours": ("b=16", "accuracy_change"),
    },
    {
        "method": "lsb",
        "source": "summary",
        "row": "training set leaked, no acc. loss (text)",
        "theirs": 0.70,
        "ours": ("b=20", "train_share"),
    },
    {
        "method": "correlation",
        "source": "code",
        "row": "λc (test_model default --cr)",
        "theirs": 1.0,
        "ours": ("λ={d}", "strength"),
    },
    {
        "method": "correlation",
        "source": "code",
        "row": "share of parameters carrying pixels",
        "theirs": 455 * 1024 / SONG_PARAMETERS,
        "ours": ("λ={d} fill", "parameter_share"),
    },
    {
        "method": "sign",
        "source": "code",
        "row": "share of parameters carrying bits",
        "theirs": 56 * 1024 * 8 / SONG_PARAMETERS,
        "ours": ("λ={d} fill", "parameter_share"),
    },
    {
        "method": "capacity",
        "source": "code",
        "row": "label bits per query (CIFAR-10, 2/pixel)",
        "theirs": 2.0,
        "ours": ("4-bit x4 r=2 {g}", "bits_per_query_nominal"),
    },
    {
        "method": "capacity",
        "source": "code",
        "row": "synthetic / real training rows (--p 1.0)",
        "theirs": 98_304 / 50_000,
        "ours": ("4-bit x4 r=2 {g}", "synthetic_ratio"),
    },
    {
        "method": "capacity",
        "source": "summary",
        "row": "recovered bits per query (FaceScrub G)",
        "theirs": 1.0,
        "ours": ("4-bit x4 r=2 {g}", "bits_per_query"),
    },
]
"""What can be set beside Song et al. (CCS 2017). The paper's result tables (LSB bits, the λc
and λs sweeps, capacity abuse's m/n sweep: accuracy and MAPE per dataset) could not be
retrieved here (/work/helpers/song_tables.md, Sec. 0 and 3), so no number of theirs is printed
as "reported in Table n". `source`: "code" = the authors' repository csong27/ml-model-remember
(CIFAR-10 ResNet-32; its defaults and the quantities they imply), "summary" = a third party's
summary of the paper (the text-model leak of ~70 % of the corpus without accuracy loss; 17
FaceScrub images recovered at 1 bit per query), "derived" = a closed form of the method. Their
setting differs from ours (CIFAR-10 colour images encoded as grayscale, a 0.46M-parameter
ResNet, 50,000 training images; here mnist5k, a 535,818-parameter MLP, 3,500 rows): the ratios
compare what each run puts in the model and gets out per parameter/query, not accuracies."""


def _ours(row: dict[str, Any] | None, field: str) -> float | None:
    """A quantity of one of our aggregated rows for the comparison with Song et al."""
    if row is None:
        return None
    pixels = 784
    if field == "bits_written":
        return float(row["options"].get("bits")) if row.get("options") else None
    if field == "train_share":
        return row["items"] / TRAIN if (row["recovered"] or 0) >= row["items"] else None
    if field == "strength":
        return (row.get("options") or {}).get("strength")
    if field == "parameter_share":
        per = pixels if row["method"] == "correlation" else pixels * row["value_bits"]
        return row["items"] * per / PARAMETERS
    if field == "bits_per_query_nominal":
        return 3.0
    if field == "synthetic_ratio":
        return row["queries"] / TRAIN if row.get("queries") else None
    return row.get(field)


def song_table(ours: list[dict[str, Any]]) -> str:
    """Song et al.'s quantities (code defaults, a summary's figures, closed forms) beside ours
    and the ratio ours/theirs."""
    head = (
        f"{'method':<11} {'Song et al. (source)':<52} {'theirs':>8} {'ours':>8} {'ratio':>6}"
        f" | {'our setting':<14}"
    )
    lines = [head, "-" * len(head)]
    for paper in SONG:
        label, field = paper["ours"]
        if "{g}" in label:
            label = label.replace("{g}", str(default_option("capacity", "generator")))
        if "{d}" in label:
            label = label.replace("{d}", f"{float(default_option(paper['method'], 'strength')):g}")
        mine = [r for r in ours if r["method"] == paper["method"] and r["epsilon"] is None]
        match = next((r for r in mine if r["label"] == label), mine[0] if mine else None)
        value = _ours(match, field)
        lines.append(
            f"{paper['method']:<11} {paper['row'] + ' (' + paper['source'] + ')':<52} "
            f"{fmt(paper['theirs'], '.3g'):>8} {fmt(value, '.3g'):>8} "
            f"{fmt(_ratio(value, paper['theirs']), '.2f'):>6} | "
            f"{match['label'] if match else '-':<14}"
        )
    lines.append(
        "Song et al.'s result tables (accuracy and MAPE per b, λc, λs, m/n): not retrieved "
        "(no paper table number is printed)."
    )
    return "\n".join(lines)


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=DEFAULT_STORE, help="models and results folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=["lsb", "correlation", "sign", "capacity"])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (500 rows, 2 epochs)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        "$ python benchmarks/memorization_table.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        file=sys.stderr if args.json else sys.stdout,
    )
    recipe, store, group = VictimRecipe(), Store(args.store), "table"
    if args.quick:
        recipe = VictimRecipe(epochs=2, model_options={"widths": [64], "activation": "relu"})
        store, group = Store(Path(args.store) / "quick"), "table-quick"
    measured = []
    for seed in args.seeds:
        rows = split(seed, 500, 200) if args.quick else split(seed)
        for method in args.methods:
            for setting in settings(method, args.quick):
                measured.append(measure(store, rows, recipe, setting, group))
    means = aggregate(measured)
    result = {
        "benchmark": "memorization_table",
        "dataset": "mnist5k",
        "split": {"test": TEST, "train": TRAIN} if not args.quick else {"test": 200, "train": 500},
        "recipe": recipe.to_dict(),
        "seeds": args.seeds,
        "rows": means,
        "song": SONG,
    }
    Store(args.store).put(
        "summary", "memorization_table" + ("-quick" if args.quick else ""), result
    )
    if args.json:
        print(json.dumps(result, default=_json_default))
    else:
        print(ours_table(means))
        print()
        print(
            "Song et al. 2017 beside ours "
            "(their code's defaults, a summary's figures, closed forms):"
        )
        print(song_table(means))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
