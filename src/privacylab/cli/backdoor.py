"""`privacylab attack backdoor` and `privacylab defend backdoor` (issue 17), over the job
`privacylab.backdoor`.

`attack backdoor` plays one backdoor game into a folder (`--out`): BadNets (Gu et al. 2017),
the trojaning attack (Liu et al. NDSS'18) or contrastive poisoning / backdooring (Carlini &
Terzis ICLR'22); `--json` prints `BackdoorResult.to_dict()` plus "folder", "epsilon",
"delta" (and "asr_bound" under DP-SGD). `defend backdoor` runs one registered backdoor defence
on such a folder; `--json` prints the detection, the flagged class against the truth, and
accuracy and ASR before and after the mitigation. Progress goes to stderr; bad input is one
`error: ...` line, exit 2.
"""

from __future__ import annotations

import json
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
from privacylab.cli.defend import defend_app
from privacylab.errors import PrivacylabError

DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda.")]


def _recipe(text: str | None, epochs: int | None) -> dict[str, Any] | None:
    """The victim recipe overrides from `--recipe` (a JSON object) and `--epochs`."""
    overrides: dict[str, Any] = {}
    if text is not None:
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as error:
            raise PrivacylabError(f"--recipe must be a JSON object: {error}") from None
        if not isinstance(parsed, dict):
            raise PrivacylabError(f"--recipe must be a JSON object, got {text!r}")
        overrides.update(parsed)
    if epochs is not None:
        overrides["epochs"] = epochs
    return overrides or None


TEXT_OPTIONS = ("layer",)
"""Options whose VALUE is always text: a module name such as "3" (an `nn.Sequential` child)."""


def _options(pairs: list[str] | None) -> dict[str, Any]:
    """`KEY=VALUE` pairs as keyword options; a VALUE is read as JSON when it parses (numbers,
    true/false, lists), else kept as text (always text for `TEXT_OPTIONS`)."""
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        name = key.strip().replace("-", "_")
        if not sep or not name:
            raise PrivacylabError(f"--option must be KEY=VALUE, got {pair!r}")
        try:
            options[name] = value if name in TEXT_OPTIONS else json.loads(value)
        except json.JSONDecodeError:
            options[name] = value
    return options


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"


@attack_app.command("backdoor")
def attack_backdoor_command(
    dataset: Annotated[
        str, typer.Option("--dataset", help="Image dataset: mnist5k, digits, ...")
    ] = "mnist5k",
    method: Annotated[
        str,
        typer.Option("--method", help="badnets, trojan, clip-poison or clip-backdoor."),
    ] = "badnets",
    poison_rate: Annotated[
        float | None,
        typer.Option(
            "--poison-rate",
            help="Poisons' share of the training set X ∪ P, in (0, 1) [0.01 when neither "
            "this nor --poisons is given].",
        ),
    ] = None,
    poisons: Annotated[
        int | None, typer.Option("--poisons", help="Number of poisons (instead of a rate).")
    ] = None,
    trigger: Annotated[
        str | None,
        typer.Option(
            "--trigger",
            help="SHAPE:SIZE@POSITION[:OPACITY], e.g. square:4@corner, pattern:3@random, "
            "logo:7@3,4, or corner/random [badnets square:4@corner, trojan square:7@corner, "
            "clip-backdoor pattern:4@corner].",
        ),
    ] = None,
    target_class: Annotated[
        int, typer.Option("--target-class", help="The backdoor's target label.")
    ] = 0,
    mode: Annotated[
        str, typer.Option("--mode", help="all-to-one, or all-to-all (badnets: y -> y+1).")
    ] = "all-to-one",
    epsilon: Annotated[
        float | None,
        typer.Option(
            "--epsilon", help="Train the victim with DP-SGD at this ε (the poisoning defence)."
        ),
    ] = None,
    delta: Annotated[float, typer.Option("--delta", help="δ of DP-SGD, in (0, 1).")] = 1e-5,
    train_size: Annotated[
        int, typer.Option("--train-size", help="Victim's training rows (before poisons).")
    ] = 3500,
    test_size: Annotated[int, typer.Option("--test-size", help="Test rows.")] = 1000,
    epochs: Annotated[
        int | None, typer.Option("--epochs", help="Victim's training epochs [the recipe's].")
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            "--recipe",
            help='Victim recipe overrides as JSON, e.g. \'{"model": "mlp", "model_options": '
            '{"widths": [64]}, "lr": 0.003}\'.',
        ),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            help="An attack option KEY=VALUE (repeatable), e.g. selection=random for trojan.",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option("--out", help="Folder of the run (models, result, report).", parser=_path_arg),
    ] = Path("privacylab-backdoor"),
    seed: Annotated[int, typer.Option("--seed")] = 0,
    device: DeviceOpt = "cpu",
    json_output: JsonOpt = False,
) -> None:
    """Backdoor a model: poison its training set (badnets, clip-*) or trojan it after
    training (trojan); report clean accuracy against the clean model of the same recipe and
    attack success rate (and, contrastive, the backdoor z-score). Writes OUT (models, result,
    report); a re-run resumes and reuses finished models."""

    def run() -> None:
        from privacylab.backdoor import (
            DATA_POISONING,
            BackdoorConfig,
            check_backdoor_config,
            run_backdoor_attack,
        )

        _writable_folder(out)
        _device(device)
        rate, count = poison_rate, poisons
        if method in DATA_POISONING and rate is None and count is None:
            rate = 0.01
        if method not in DATA_POISONING:
            rate = count = None
        config = BackdoorConfig(
            dataset=dataset,
            method=method,
            poison_rate=rate,
            poisons=count,
            trigger=trigger,
            target_class=target_class,
            mode=mode,
            epsilon=epsilon,
            delta=delta,
            train_size=train_size,
            test_size=test_size,
            seed=seed,
            device=device,
            recipe=_recipe(recipe, epochs),
            attack_options=_options(option) or None,
        )
        check_backdoor_config(config)
        console = _stderr()
        if method not in DATA_POISONING and (poison_rate is not None or poisons is not None):
            _say(console, f"note: {method} injects no poisons; --poison-rate/--poisons ignored")
        with _Stages(console) as stages:
            result = run_backdoor_attack(config, out.resolve(), progress=stages)
        if json_output:
            _emit_json(result)
            return
        print_attack(result)
        _say(console, f"wrote {out} (result.json, index.html)")

    _guarded(run)


def print_attack(result: dict[str, Any]) -> None:
    """The attack's numbers as a small plain table on stdout."""
    rows = [
        ["clean accuracy", _pct(result.get("clean_accuracy"))],
        ["clean model's accuracy", _pct(result.get("baseline_accuracy"))],
        ["attack success rate", _pct(result.get("asr"))],
        ["clean model's ASR", _pct(result.get("baseline_asr"))],
        ["poisons", f"{result.get('poisons')} ({_pct(result.get('poison_rate'))})"],
    ]
    if result.get("z_score") is not None:
        rows.append(["backdoor z-score", f"{float(result['z_score']):.2f}"])
    if result.get("epsilon") is not None:
        rows.append(["DP-SGD ε", f"{float(result['epsilon']):g}"])
        if result.get("asr_bound") is not None:
            rows.append(["group-privacy ASR bound", _pct(result["asr_bound"])])
    trigger = (result.get("trigger") or {}).get("spec", "-")
    print(f"{result.get('method')} on {result.get('dataset')}, trigger {trigger}")
    print(_plain_table(["", "value"], rows))


@defend_app.command("backdoor")
def defend_backdoor_command(
    target: Annotated[
        Path,
        typer.Option(
            "--target",
            help="The --out folder of `privacylab attack backdoor` (or its model/).",
            parser=_path_arg,
        ),
    ],
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="neural-cleanse, strip, activation-clustering, spectral or fine-pruning.",
        ),
    ] = "neural-cleanse",
    option: Annotated[
        list[str] | None,
        typer.Option("--option", help="A defence option KEY=VALUE (repeatable), e.g. seeds=5."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="The defence's seed [the attack's].")
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Run again even if a finished run is stored.")
    ] = False,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda [the attack's].")
    ] = None,
    json_output: JsonOpt = False,
) -> None:
    """Inspect the backdoored model of an attack folder with one defence: detection, the
    flagged class (checked against the attack's target), Neural Cleanse's anomaly index, and
    accuracy and ASR before and after its mitigation; for defences that flag training rows,
    their precision and recall against the true poisons. Writes TARGET/defenses/METHOD.json
    and adds the run to TARGET's report."""

    def run() -> None:
        from privacylab.backdoor import defend_backdoor, run_folder

        if device is not None:
            _device(device)
        options = _options(option)
        folder = run_folder(target)
        with _Stages(_stderr()) as stages:
            result = defend_backdoor(
                folder,
                method,
                options=options,
                seed=seed,
                device=device,
                fresh=fresh,
                progress=stages,
            )
        if json_output:
            _emit_json(result)
            return
        print_defense(result)

    _guarded(run)


def print_defense(result: dict[str, Any]) -> None:
    """The defence's verdict and its before/after numbers as a small plain table."""
    before, after = result.get("before") or {}, result.get("after") or {}
    rows = result.get("rows") or {}
    flagged = result.get("flagged_class")
    mark = {True: " (the target)", False: " (not the target)", None: ""}[
        result.get("correct_class")
    ]
    anomaly = result.get("anomaly_index")
    lines = [
        ["detected", {True: "yes", False: "no", None: "-"}[result.get("detected")]],
        ["flagged class", "-" if flagged is None else f"{flagged}{mark}"],
        ["anomaly index", "-" if anomaly is None else f"{float(anomaly):.2f}"],
        ["accuracy", f"{_pct(before.get('accuracy'))} -> {_pct(after.get('accuracy'))}"],
        ["attack success rate", f"{_pct(before.get('asr'))} -> {_pct(after.get('asr'))}"],
    ]
    if rows.get("flagged") is not None:
        lines.append(
            [
                "flagged rows",
                f"{rows['flagged']} (precision {_pct(rows.get('precision'))}, recall "
                f"{_pct(rows.get('recall'))} of {rows.get('poisons')} poisons)",
            ]
        )
    print(f"{result.get('method')} on {result.get('folder')} ({result.get('attack')})")
    print(_plain_table(["", "value"], lines))
