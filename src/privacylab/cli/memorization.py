"""`privacylab attack memorization` (issue 18), over the job `privacylab.memorize`.

Training code that hides its training data in the model (Song, Ristenpart & Shmatikov, CCS
2017): `--method lsb` (least significant bits of the weights, Sec. 4.1), `correlation`
(correlated value encoding, Sec. 4.2), `sign` (sign encoding, Sec. 4.3) or `capacity`
(capacity abuse through label queries, Sec. 5). `--json` prints `MemorizationResult.to_dict()`
plus "folder", "epsilon", "delta", "items", "pixel_bits" and "checks" (the weight checks on
the released model and on the honest one). Every refusal — unknown method or dataset, more
bits than the model holds (the line states the capacity), fewer bits than one item, lsb under
DP-SGD — is one `error: ...` line with exit code 2, before any training. Progress on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import (
    JsonOpt,
    _device,
    _emit_json,
    _guarded,
    _path_arg,
    _plain_table,
    _say,
    _Stages,
    _stderr,
    _writable_folder,
)
from privacylab.cli.attack import attack_app
from privacylab.cli.backdoor import _options, _pct, _recipe
from privacylab.cli.defend import _num


@attack_app.command("memorization")
def attack_memorization_command(
    dataset: Annotated[
        str, typer.Option("--dataset", help="mnist5k, digits (images) or breast_cancer (rows).")
    ] = "mnist5k",
    method: Annotated[
        str, typer.Option("--method", help="lsb, correlation, sign or capacity.")
    ] = "lsb",
    bits: Annotated[
        int | None,
        typer.Option(
            "--bits",
            help="Size of the secret in bits: the whole items that fit (default: the method's "
            "item count: lsb 100, correlation 100, sign 40, capacity 4 images).",
        ),
    ] = None,
    pixel_bits: Annotated[
        int | None,
        typer.Option(
            "--pixel-bits",
            help="Bits per image pixel of the secret (default: lsb 8, correlation 8, sign 4, "
            "capacity 4).",
        ),
    ] = None,
    epsilon: Annotated[
        float | None,
        typer.Option("--epsilon", help="Train both models with DP-SGD at this ε (not lsb)."),
    ] = None,
    delta: Annotated[float, typer.Option("--delta", help="δ of DP-SGD, in (0, 1).")] = 1e-5,
    train_size: Annotated[
        int, typer.Option("--train-size", help="The data holder's training rows.")
    ] = 3500,
    test_size: Annotated[int, typer.Option("--test-size", help="Test rows.")] = 1000,
    epochs: Annotated[
        int | None, typer.Option("--epochs", help="Training epochs (default: the recipe's, 20).")
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            "--recipe",
            help='Victim recipe overrides as JSON, e.g. \'{"model_options": {"widths": [64]}, '
            '"lr": 0.01}\'.',
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            help="An attack option KEY=VALUE (repeatable), e.g. bits=16 for lsb, strength=5 "
            "for correlation, ratio=2 for capacity.",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option("--out", help="Folder of the run (models, result, report).", parser=_path_arg),
    ] = Path("privacylab-memorization"),
    seed: Annotated[int, typer.Option("--seed")] = 0,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Hide part of the training data in a model with malicious training code and decode it
    from the released model: clean accuracy against an honest model of the same recipe, items
    recovered, bit accuracy, PSNR, queries, and the weight checks. Writes OUT (models,
    result, report); a re-run resumes and reuses finished models."""

    def run() -> None:
        from privacylab.memorize import (
            MemorizationConfig,
            check_memorization_config,
            run_memorization_job,
        )

        _writable_folder(out)
        _device(device)
        config = MemorizationConfig(
            dataset=dataset,
            method=method,
            bits=bits,
            pixel_bits=pixel_bits,
            epsilon=epsilon,
            delta=delta,
            train_size=train_size,
            test_size=test_size,
            seed=seed,
            device=device,
            recipe=_recipe(recipe, epochs),
            attack_options=_options(option) or None,
        )
        check_memorization_config(config)
        console = _stderr()
        with _Stages(console) as stages:
            result = run_memorization_job(config, out.resolve(), progress=stages)
        if json_output:
            _emit_json(result)
            return
        print_memorization(result)
        _say(console, f"wrote {out} (result.json, index.html)")

    _guarded(run)


def print_memorization(result: dict[str, Any]) -> None:
    """The run's numbers as a small plain table on stdout."""
    rows = [
        ["clean accuracy", _pct(result.get("clean_accuracy"))],
        ["honest model's accuracy", _pct(result.get("honest_accuracy"))],
        ["items recovered", f"{result.get('recovered')} of {result.get('items')}"],
        ["bit accuracy", _pct(result.get("bit_accuracy"))],
        ["PSNR (dB)", _num(result.get("psnr"), 1)],
        ["queries", str(result.get("queries"))],
    ]
    if result.get("bits_per_parameter") is not None:
        rows.append(["bits per parameter", _num(result["bits_per_parameter"], 4)])
    if result.get("bits_per_query") is not None:
        rows.append(["bits per query", _num(result["bits_per_query"], 3)])
    if result.get("epsilon") is not None:
        rows.append(["DP-SGD ε", f"{float(result['epsilon']):g}"])
    for name, check in (result.get("checks") or {}).items():
        flagged = "flagged" if check.get("flagged") else "not flagged"
        honest = " (honest model flagged too)" if check.get("honest_flagged") else ""
        rows.append([f"check {name}", f"{flagged}{honest}"])
    requantized = result.get("requantized")
    if requantized:
        rows.append(
            [
                "after re-quantisation",
                f"bit accuracy {_pct(requantized.get('bit_accuracy'))}, accuracy "
                f"{_pct(requantized.get('accuracy'))}",
            ]
        )
    print(f"{result.get('method')} on {result.get('dataset')}")
    print(_plain_table(["", "value"], rows))
