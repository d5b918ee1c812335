"""Your model, your data: a user-defined network trained with a plain PyTorch loop, audited
through the documented CLI and Python paths, gives the zoo path's numbers for the same network."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tests.byo.user_net import fit, make_net
from typer.testing import CliRunner

from privacylab.attacks.membership.references import Recipe
from privacylab.byo import own_model_config, report_own_model
from privacylab.cli import app
from privacylab.data import load_dataset
from privacylab.data.arrays import load_arrays, save_arrays
from privacylab.experiment import attack_target, model_game
from privacylab.models import build_model
from privacylab.report import membership_metrics
from privacylab.training import TrainConfig

USER_NET = str(Path(__file__).with_name("user_net.py")) + ":make_net"
ATTACKS = ("loss", "confidence", "lira-offline", "rmia", "gap")
RECIPE = TrainConfig(epochs=4, batch_size=64, lr=0.1, optimizer="momentum", seed=0)
ZOO_OPTIONS = {"widths": [32], "activation": "tanh"}
KEYS = ("auc", "tpr_at_1pct_fpr", "tpr_at_01pct_fpr", "epsilon_lower_bound", "queries")


@pytest.fixture(scope="module")
def user_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """digits: 240 training rows (members), 240 test rows; the user's net trained on the first."""
    folder = tmp_path_factory.mktemp("byo")
    digits = load_dataset("digits")
    x, y = digits.features, digits.labels
    data = save_arrays(folder / "data.npz", x[:240], y[:240], x[240:480], y[240:480])
    torch.manual_seed(0)
    net = make_net((1, 8, 8), 10)
    fit(net, x[:240], y[:240])
    save_file(net.state_dict(), str(folder / "net.safetensors"))
    return {"folder": folder, "data": data, "weights": folder / "net.safetensors"}


def _metrics(payload: dict) -> dict[str, dict[str, float]]:
    (target,) = payload["targets"]
    return {a["attack"]: {k: a[k] for k in KEYS} for a in target["attacks"]}


def _config():
    return own_model_config(attacks=ATTACKS, references=4, workers=1, subsample=20)


def test_user_model_cli_python_and_zoo_paths_agree(user_files, tmp_path):
    """The same trained weights as (1) the user's class through the CLI, (2) through Python and
    (3) the zoo's equivalent `mlp` through the zoo path give identical attack results."""
    python = report_own_model(
        USER_NET,
        user_files["data"],
        tmp_path / "py",
        weights=user_files["weights"],
        recipe=RECIPE,
        config=_config(),
    )
    result = CliRunner().invoke(
        app,
        [
            "run", "--model-factory", USER_NET, "--weights", str(user_files["weights"]),
            "--data", str(user_files["data"]), "--references", "4", "--workers", "1",
            "--epochs", "4", "--batch-size", "64", "--lr", "0.1",
            "--attacks", ",".join(ATTACKS), "--out", str(tmp_path / "cli"), "--json",
            "--verdict-threshold", "0.01",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cli = json.loads(result.stdout)
    assert (tmp_path / "cli" / "index.html").is_file()
    assert cli["verdict_threshold"] == 0.01 and python["verdict_threshold"] == 0.002
    # the most exposed examples are named by their row in the user's data
    (target,) = cli["targets"]
    assert "verdict" in target
    exposed = target["risk"]["most_exposed"]
    assert exposed and all(0 <= row["index"] < 240 for row in exposed)  # training rows

    data = load_arrays(user_files["data"])
    zoo = build_model("mlp", (1, 8, 8), 10, widths=(32,), activation="tanh")
    user_weights = make_net((1, 8, 8), 10)
    from safetensors.torch import load_file

    user_weights.load_state_dict(load_file(str(user_files["weights"])))
    for (_, p_zoo), (_, p_user) in zip(
        zoo.named_parameters(), user_weights.named_parameters(), strict=True
    ):
        p_zoo.data.copy_(p_user.data)
    game = model_game(
        zoo,
        data,
        Recipe(str(user_files["data"]), "mlp", RECIPE.to_dict(), ZOO_OPTIONS),
        references=4,
        cache=tmp_path / "zoo-cache",
        workers=1,
    )  # fmt: skip
    small = _config()
    results = attack_target(
        game.target, game.task, game.membership, ATTACKS, subsample=small.subsample, seed=0
    )
    zoo_metrics = {r.attack: membership_metrics(r).to_dict() for r in results}
    ours = _metrics(python)
    assert ours == _metrics(cli)
    for attack in ATTACKS:
        for key in KEYS:
            assert ours[attack][key] == pytest.approx(zoo_metrics[attack][key], abs=1e-9), (
                attack,
                key,
            )
    # the user's overfit model (train accuracy 1.0) leaks: the loss attack is better than chance
    assert ours["loss"]["auc"] > 0.6


def test_references_trained_by_the_users_own_loop(user_files, tmp_path):
    """With `train_fn`, references are trained by the user's loop (the target's own recipe), and
    LiRA/RMIA then find the overfit model's members well above chance."""
    payload = report_own_model(
        make_net,
        user_files["data"],
        tmp_path / "fn",
        weights=user_files["weights"],
        train_fn=fit,
        config=_config(),
    )
    metrics = _metrics(payload)
    assert metrics["lira-offline"]["auc"] > 0.6
    assert metrics["rmia"]["auc"] > 0.6
    stored = json.loads((tmp_path / "fn" / "cache" / "references").glob("*/ref-000/model.json")
                        .__next__().read_text())  # fmt: skip
    assert stored["metadata"]["training"]["train_fn"].endswith("user_net:fit")
    # a second run trains nothing: the store has every reference
    again = report_own_model(
        make_net,
        user_files["data"],
        tmp_path / "fn",
        weights=user_files["weights"],
        train_fn=fit,
        config=_config(),
    )
    assert _metrics(again) == metrics


def test_arrays_in_memory_and_the_trained_module(user_files, tmp_path):
    """Arrays and the trained module itself, instead of files, give the same report."""
    data = load_arrays(user_files["data"])
    n = data.train_size
    net = make_net((1, 8, 8), 10)
    from safetensors.torch import load_file

    net.load_state_dict(load_file(str(user_files["weights"])))
    arrays = (data.features[:n], data.labels[:n], data.features[n:], data.labels[n:])
    payload = report_own_model(
        make_net, arrays, tmp_path / "mem", model=net, recipe=RECIPE, config=_config()
    )
    from_files = report_own_model(
        make_net,
        user_files["data"],
        tmp_path / "files",
        weights=user_files["weights"],
        recipe=RECIPE,
        config=_config(),
    )
    assert _metrics(payload) == _metrics(from_files)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-factory", "nowhere.module:make"], "needs all of"),
        (["--model-factory", "nowhere_pkg_xyz:make", "--weights", "W", "--data", "D"], "import"),
        (["--model-factory", "USER:no_such", "--weights", "W", "--data", "D"], "no attribute"),
        (["--model-factory", "USER", "--weights", "BAD", "--data", "D"], "do not fit"),
        (["--model-factory", "USER", "--weights", "W", "--data", "MISSING"], "no data"),
        (["--model-factory", "USER", "--weights", "W", "--data", "D", "--outputs", "x"], "outputs"),
        (["--model-factory", "BN", "--weights", "BNW", "--data", "D", "--epsilon", "4"], "Batch"),
        (["--model-factory", "WIDE", "--weights", "WIDEW", "--data", "D"], "expected (2, 10)"),
    ],
)
def test_bad_own_model_input_is_one_line(user_files, tmp_path, args, message):
    bad = tmp_path / "bad.safetensors"
    save_file({"fc1.weight": torch.zeros(3, 3)}, str(bad))
    from tests.byo.user_net import make_batchnorm_net, make_wrong_width_net

    save_file(make_batchnorm_net((1, 8, 8), 10).state_dict(), str(tmp_path / "bn.safetensors"))
    save_file(make_wrong_width_net((1, 8, 8), 10).state_dict(), str(tmp_path / "w.safetensors"))
    subs = {
        "BN": USER_NET.replace(":make_net", ":make_batchnorm_net"),
        "BNW": str(tmp_path / "bn.safetensors"),
        "WIDE": USER_NET.replace(":make_net", ":make_wrong_width_net"),
        "WIDEW": str(tmp_path / "w.safetensors"),
        "USER": USER_NET,
        "USER:no_such": USER_NET.replace(":make_net", ":no_such"),
        "W": str(user_files["weights"]),
        "BAD": str(bad),
        "D": str(user_files["data"]),
        "MISSING": str(tmp_path / "missing.npz"),
    }
    argv = ["run", *[subs.get(a, a) for a in args], "--out", str(tmp_path / "o"), "--workers", "1"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert "Traceback" not in result.output


def test_softmax_model_is_refused_as_logits_and_read_as_probabilities(user_files, tmp_path):
    """A model ending in nn.Softmax must not be softmaxed again: as logits it is refused with one
    line; declared as probabilities, its score attacks equal the logits model's."""
    from privacylab.target import Target

    data = load_arrays(user_files["data"])
    net = make_net((1, 8, 8), 10)
    from safetensors.torch import load_file

    net.load_state_dict(load_file(str(user_files["weights"])))
    softmax = torch.nn.Sequential(net, torch.nn.Softmax(dim=1))
    x = data.features[:50]
    with pytest.raises(Exception, match="probabilities"):
        Target(softmax, "scores", 10).probabilities(x)
    as_probs = Target(softmax, "scores", 10, outputs="probabilities").probabilities(x)
    as_logits = Target(net, "scores", 10).probabilities(x)
    torch.testing.assert_close(as_probs, as_logits)


def test_arrays_loader_checks_files(tmp_path):
    x = np.random.default_rng(0).random((6, 4)).astype(np.float32)
    y = np.array([0, 1, 0, 1, 0, 1])
    good = save_arrays(tmp_path / "good.npz", x, y, x, y)
    ds = load_arrays(good)
    assert ds.kind == "tabular" and ds.train_size == 6 and len(ds) == 12 and ds.num_classes == 2
    folder = tmp_path / "folder"
    folder.mkdir()
    for key, value in {"x_train": x, "y_train": y, "x_test": x, "y_test": y}.items():
        np.save(folder / f"{key}.npy", value)
    assert torch.equal(load_dataset(str(folder)).features, ds.features)
    images = save_arrays(tmp_path / "img.npz", x.reshape(6, 2, 2), y, x.reshape(6, 2, 2), y)
    assert load_arrays(images).input_shape == (1, 2, 2)

    from privacylab.data import DataError

    nan = x.copy()
    nan[0, 0] = np.nan
    cases = {
        "nan": ((nan, y, x, y), "NaN"),
        "rows": ((x, y[:5], x, y), "labels"),
        "width": ((x, y, x[:, :3], y), "differ"),
        "float-labels": ((x, y + 0.5, x, y), "whole numbers"),
        "negative": ((x, y - 1, x, y), ">= 0"),
    }
    for name, (arrays, message) in cases.items():
        path = save_arrays(tmp_path / f"{name}.npz", *arrays)
        with pytest.raises(DataError, match=message):
            load_arrays(path)
    np.savez(tmp_path / "objects.npz", x_train=np.array([{}], dtype=object), y_train=y,
             x_test=x, y_test=y)  # fmt: skip
    with pytest.raises(DataError, match="Python objects"):
        load_arrays(tmp_path / "objects.npz")
    np.savez(tmp_path / "missing.npz", x_train=x, y_train=y)
    with pytest.raises(DataError, match="x_test"):
        load_arrays(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="npz"):
        load_arrays(tmp_path / "junk.npz")
