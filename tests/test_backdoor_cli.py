"""`privacylab attack backdoor` and `privacylab defend backdoor`: the JSON keys both print (one
object on stdout, progress on stderr), a re-run reusing the saved models, the defend
sub-command on the attack's folder (and on its model/), bad input as one `error:` line with
exit 2, and `privacylab defend` still a command of its own when no sub-command is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli import command

attack, attack_json, attack_fails = command("attack", "backdoor")
defend, defend_json, defend_fails = command("defend", "backdoor")

TINY = ["--dataset", "digits", "--train-size", "400", "--test-size", "200", "--epochs", "15"]
RECIPE = ["--recipe", '{"model": "mlp", "model_options": {"widths": [32]}, "lr": 0.01}']
GAME = [*TINY, *RECIPE, "--trigger", "square:2@corner", "--poison-rate", "0.05"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cli") / "run"
    return out, attack_json(*GAME, "--out", str(out))


def test_attack_json_keys(folder) -> None:
    out, payload = folder
    assert {"clean_accuracy", "asr", "z_score", "folder", "epsilon", "delta"} <= set(payload)
    assert {"baseline_accuracy", "baseline_asr", "poisons", "poison_rate", "trigger"} <= set(
        payload
    )
    assert payload["method"] == "badnets" and payload["folder"] == str(out.resolve())
    assert payload["trigger"] == {"spec": "square:2@corner"} and payload["poisons"] == 21
    assert payload["epsilon"] is None and payload["z_score"] is None
    assert payload["asr"] > payload["baseline_asr"]
    assert json.loads((out / "result.json").read_text()) == payload
    assert (out / "results.json").is_file() and (out / "index.html").is_file()


def test_attack_rerun_reuses_the_models(folder) -> None:
    out, payload = folder
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/model.safetensors")}
    assert len(stamps) == 2
    result = attack(*GAME, "--out", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == payload
    assert "reused" in result.stderr
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_attack_summary_without_json(folder) -> None:
    out, _ = folder
    result = attack(*GAME, "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "attack success rate" in result.stdout and "badnets on digits" in result.stdout


def test_defend_json_keys_on_the_folder_and_its_model(folder) -> None:
    out, payload = folder
    keys = {
        "method",
        "detected",
        "flagged_class",
        "anomaly_index",
        "target_class",
        "correct_class",
        "before",
        "after",
        "rows",
        "seconds",
        "details",
    }
    verdict = defend_json("--target", str(out / "model"), "--method", "fine-pruning")
    assert keys <= set(verdict)
    assert verdict["method"] == "fine-pruning" and verdict["target_class"] == 0
    assert {"accuracy", "asr"} <= set(verdict["before"]) and {"accuracy", "asr"} <= set(
        verdict["after"]
    )
    assert verdict["before"]["asr"] == pytest.approx(payload["asr"])
    assert (out / "defenses" / "fine-pruning.json").is_file()
    assert defend_json("--target", str(out), "--method", "fine-pruning") == verdict
    text = defend("--target", str(out), "--method", "fine-pruning")
    assert text.exit_code == 0 and "attack success rate" in text.stdout


def test_a_layer_option_is_a_module_name_even_when_numeric(folder) -> None:
    out, _ = folder
    args = ["--target", str(out), "--method", "fine-pruning", "--option", "layer=1"]
    verdict = defend_json(*args, "--option", "epochs=0")
    assert verdict["details"]["layer"] == "1" and verdict["options"]["layer"] == "1"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--dataset", "mnist5k", "--trigger", "square:40@corner"], "larger than the 28x28"),
        (["--poison-rate", "0"], "poison rate must be in (0, 1), got 0.0"),
        (["--poison-rate", "1.5"], "poison rate must be in (0, 1), got 1.5"),
        (["--poison-rate", "0.1", "--poisons", "5"], "exactly one of --poison-rate or --poisons"),
        (["--method", "blend"], "choose one of badnets, trojan, clip-poison, clip-backdoor"),
        (["--dataset", "imagenet"], "unknown dataset 'imagenet'; available:"),
        (["--trigger", "star:3@corner"], "unknown trigger shape 'star'"),
        (["--option", "colour"], "--option must be KEY=VALUE"),
        (["--recipe", "[1]"], "--recipe must be a JSON object"),
        (["--recipe", '{"epsilon": 1}'], "give the victim's ε with --epsilon"),
        (["--target-class", "12"], "--target-class must be in [0, 10)"),
    ],
)
def test_attack_bad_input_is_one_line(args, said, tmp_path) -> None:
    options = [*TINY, *RECIPE, "--out", str(tmp_path / "x"), *args]
    line = attack_fails(*options)
    assert said in line
    assert not (tmp_path / "x").exists()


def test_trigger_error_names_both_sizes(tmp_path) -> None:
    line = attack_fails("--dataset", "mnist5k", "--trigger", "square:40@corner")
    assert "40" in line and "28x28" in line


def test_defend_bad_input_is_one_line(folder, tmp_path) -> None:
    out, _ = folder
    line = defend_fails("--target", str(out), "--method", "magic")
    assert "unknown backdoor defence 'magic'; choose one of" in line
    assert "neural-cleanse" in line
    assert "is not a folder" in defend_fails("--target", str(tmp_path / "no"), "--method", "strip")
    assert "holds no backdoor run" in defend_fails("--target", str(tmp_path), "--method", "strip")
    assert "takes no option colour" in defend_fails(
        "--target", str(out), "--method", "spectral", "--option", "colour=red"
    )


def test_trojan_says_it_ignores_the_poison_budget(tmp_path) -> None:
    cheap = ["trigger_steps=20", "images_per_class=2", "inversion_steps=10", "retrain_epochs=2"]
    options = [a for pair in cheap for a in ("--option", pair)]
    args = [*TINY, *RECIPE, "--method", "trojan", "--trigger", "square:3@corner", *options]
    result = attack(*args, "--poison-rate", "0.05", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    assert "note: trojan injects no poisons; --poison-rate/--poisons ignored" in result.stderr
    payload = json.loads(result.stdout)
    assert payload["method"] == "trojan" and payload["poisons"] == 0
    assert {"orig", "orig_dec", "orig_tri", "ext_tri"} <= set(payload["details"])
    again = attack(*args, "--out", str(tmp_path), "--json")
    assert again.exit_code == 0 and json.loads(again.stdout) == payload


def test_defend_refuses_a_contrastive_folder(tmp_path) -> None:
    from privacylab.backdoor import BackdoorConfig

    config = BackdoorConfig(dataset="digits", method="clip-backdoor", poisons=5, poison_rate=None)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    line = defend_fails("--target", str(tmp_path), "--method", "strip")
    assert "clip-backdoor run of a contrastive image–text model" in line
    assert "inspect classifiers" in line


def test_defend_is_still_a_command_of_its_own() -> None:
    from typer.testing import CliRunner

    from privacylab.cli import app

    result = CliRunner().invoke(app, ["defend", "--help"])
    assert result.exit_code == 0
    assert "--defenses" in result.stdout and "backdoor" in result.stdout
    refused = CliRunner().invoke(app, ["defend", "--dataset", "digits", "--defenses", ","])
    assert refused.exit_code == 2 and "no defences given" in refused.stderr
