"""`privacylab attack lm-membership`: membership inference on a trained language model (a folder
of `privacylab lm train`) with the LM membership attacks of `privacylab.attacks.language`
(loss, zlib, reference, lowercase, Min-K%, Min-K%++; Duan et al. 2024's comparison), run by
`privacylab.lm_membership.run_lm_membership_job`.

Each finished attack is written to a result store (`--store`, default
TARGET/lm-membership.sqlite) and a re-run reads it back. `--json` prints the membership run
(schemas: target facts, reference facts, documents, per attack its metrics and ROC points, the
attacks ordered by AUC, queries, how many attacks were read back, seconds). With `--out`, the
run joins the report's "#language-models" section (`privacylab.report.language.add_language_run`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privacylab.cli._common import JsonOpt, _device, _guarded, _path_arg
from privacylab.cli._language import (
    DeviceOpt,
    ModelFolderOpt,
    OutOpt,
    Summary,
    run_language_job,
    store_option,
)
from privacylab.cli.attack import attack_app
from privacylab.errors import PrivacylabError

STORE = "lm-membership.sqlite"
"""Default result store, inside the target folder."""

SUMMARY = (
    ("name", "attack"),
    ("auc", "AUC"),
    ("tpr_at_1pct_fpr", "TPR@1%FPR"),
    ("tpr_at_01pct_fpr", "TPR@0.1%FPR"),
    ("advantage", "advantage"),
    ("epsilon_lower_bound", "ε lower bound"),
    ("queries", "queries"),
)
"""(key, header) of the terminal summary, one row per attack."""


StoreOpt = store_option(STORE, "finished attacks")


@attack_app.command("lm-membership")
def attack_lm_membership_command(
    target: ModelFolderOpt,
    reference: Annotated[
        Path | None,
        typer.Option(
            "--reference",
            help="The attacker's reference model folder (trained on similar public text); "
            "needed by the reference attack.",
            parser=_path_arg,
        ),
    ] = None,
    attacks: Annotated[
        str,
        typer.Option(
            "--attacks",
            help="Comma-separated attacks: loss, zlib, reference, lowercase, min-k, min-k++ "
            "(default: all; reference only with --reference).",
        ),
    ] = "loss,zlib,reference,lowercase,min-k,min-k++",
    documents: Annotated[
        int,
        typer.Option(
            "--documents", help="Members and held-out documents scored (up to this many each)."
        ),
    ] = 500,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the document sample.")] = 0,
    store: StoreOpt = None,
    device: DeviceOpt = "cpu",
    out: OutOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Was a document in the training set? Score member documents (without planted strings)
    and held-out documents with each attack; report AUC, TPR at 1% and 0.1% FPR, advantage and
    the ε lower bound on one metrics path. Finished attacks are stored; a re-run resumes."""

    def run() -> None:
        from privacylab.lm_membership import run_lm_membership_job

        if reference is not None and not reference.is_dir():
            raise PrivacylabError(f"--reference {reference} is not a model folder")
        if documents < 1:
            raise PrivacylabError(f"--documents must be a whole number >= 1, got {documents}")
        if seed < 0:
            raise PrivacylabError(f"--seed must be a whole number >= 0, got {seed}")

        def summary(result: dict[str, Any]) -> Summary:
            docs = result["documents"]
            heading = (
                f"LM membership inference on {target}: {docs['members']} members, "
                f"{docs['heldout']} held-out documents (best: {result['order'][0]})"
            )
            return heading, SUMMARY, result["attacks"]

        run_language_job(
            target=target,
            out=out,
            json_output=json_output,
            kind="membership",
            job=lambda stages: run_lm_membership_job(
                target,
                reference=reference,
                attacks=attacks,
                documents=documents,
                seed=seed,
                device=_device(device),
                store=store if store is not None else target / STORE,
                progress=stages,
            ),
            summary=summary,
        )

    _guarded(run)
