"""`privacylab dpforward train` (Du et al. 2023, DP-Forward): one tiny DP-Forward run whose
`--json` object has exactly the facts keys of schemas.md §3 (and is what the folder holds), the
plain summary of the finished folder, and bad input (ε <= 0, an unknown position, a layer index
out of range, C <= 0, ...) refused with one `error:` line and exit code 2 before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from _cli import command
from privacylab.dpforward import forward_facts

invoke, run_json, fails = command("dpforward", "train")

FACT_KEYS = {
    "method",
    "position",
    "frozen",
    "encoder",
    "layers",
    "epsilon",
    "delta",
    "event",
    "accountant",
    "privacy",
    "label_epsilon",
    "accuracy",
    "train_accuracy",
    "members",
    "non_members",
    "epochs",
    "seconds",
    "seconds_per_step",
    "folder",
}
TINY = ("--encoder", "tiny", "--documents", "48", "--max-len", "16", "--epochs", "1")


def test_json_keys_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "fwd"
    args = (*TINY, "--epsilon", "5", "--position", "input", "--label-epsilon", "1")
    payload = run_json(*args, "--clip", "2", "--lr", "1e-3", "--out", str(out))
    assert set(payload) == FACT_KEYS
    assert payload["method"] == "dp-forward" and payload["position"] == "input"
    assert payload["epsilon"] == pytest.approx(5.0, rel=1e-6)
    assert payload["privacy"]["sensitivity"] == 4.0 and payload["label_epsilon"] == 1.0
    assert payload["event"]["event"]["type"] == "matrix_gaussian"
    assert payload["event"]["event"]["rows"] == 16 and payload["accountant"] == "pld"
    assert payload == forward_facts(out)
    result = invoke(*args, "--clip", "2", "--lr", "1e-3", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "dp-forward at input" in result.stdout and "eps=5" in result.stdout
    assert "labels RR eps=1" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--epsilon", "0"), "epsilon must be a finite number > 0"),
        (("--epsilon", "-1"), "epsilon must be a finite number > 0"),
        (("--method", "non-private", "--epsilon", "-1"), "epsilon must be a finite number > 0"),
        (("--position", "middle"), "unknown position 'middle'"),
        (("--position", "layer:3"), "layer index 3 is out of range"),
        (("--position", "layer:0"), "layer index 0 is out of range"),
        (("--clip", "0"), "clip C must be a finite number > 0"),
        (("--clip", "-0.5"), "clip C must be a finite number > 0"),
        (("--method", "dp-magic"), "unknown method"),
        (("--method", "dp-sgd", "--label-epsilon", "1"), "label epsilon"),
        (("--label-epsilon", "0"), "label epsilon must be a finite number > 0"),
        (("--delta", "1.5"), "delta must be in"),
        (("--encoder", "bert-large"), "unknown encoder"),
        (("--device", "tpu"), "device"),
        (("--method", "dp-sgd", "--reduce", "8"), "reduce"),
        (("--method", "dp-sgd", "--frozen"), "frozen (one release per training sequence)"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    line = fails(*TINY, *args, "--out", str(tmp_path / "never"))
    assert message in line
    assert not (tmp_path / "never").exists()


def test_layer_out_of_range_for_minilm_depth(tmp_path: Path) -> None:
    line = fails("--position", "layer:7", "--out", str(tmp_path / "never"))
    assert "layer index 7 is out of range: the encoder has layers 1..6" in line
    line = fails("--layers", "2", "--position", "layer:3", "--out", str(tmp_path / "never"))
    assert "layers 1..2" in line


def test_frozen_accounts_one_release_per_training_sequence(tmp_path: Path) -> None:
    """--frozen (Du et al. 2023, Sec. 3.3): two epochs on ONE release per training sequence;
    the ε of the facts is that of one release (the inference ε) and the summary says so."""
    out = tmp_path / "frozen"
    args = ("--encoder", "tiny", "--documents", "48", "--max-len", "16", "--epochs", "2")
    payload = run_json(*args, "--frozen", "--epsilon", "3", "--out", str(out))
    privacy = payload["privacy"]
    assert payload["epochs"] == 2 and privacy["releases"] == 1
    assert payload["event"]["count"] == 1
    assert payload["epsilon"] == pytest.approx(3.0, rel=1e-6)
    assert privacy["inference_epsilon"] == pytest.approx(payload["epsilon"], rel=1e-9)
    result = invoke(*args, "--frozen", "--epsilon", "3", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "SeqLDP of 1 release(s) per training sequence" in result.stdout
