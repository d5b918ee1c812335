"""`privacylab attack exposure`: the exposure of every Secret-Sharer canary planted in a language
model trained by `privacylab lm train` (Carlini et al. 2019, Sec. 4; job
`privacylab.lm_exposure`).

--json prints the "exposure run" object: per canary its insertion count (`repeats`), the
largest exposure log2|R| (`space_bits`), its `rank` and `exposure` and, where the space was
enumerated, the skew-normal extrapolation of the same canary (`extrapolated_exposure`), plus the
queries and time. With `--out`, the run joins `results.json` and `index.html` (section
`#language-models`, exposure against insertion count).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from privacylab.cli._common import JsonOpt, _device, _guarded, _stderr, _whole_in
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

STORE = "exposure.sqlite"
"""Default result store, inside the target folder."""

COLUMNS = (
    ("prefix", "canary prefix"),
    ("repeats", "repeats"),
    ("space_bits", "log2|R|"),
    ("rank", "rank"),
    ("exposure", "exposure"),
    ("extrapolated_exposure", "extrapolated"),
    ("method", "method"),
)


def _rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Terminal rows: canaries by insertion count, user canaries last."""
    return sorted(run["canaries"], key=lambda c: (bool(c["user"]), c["repeats"], c["prefix"]))


StoreOpt = store_option(STORE, "finished canary formats")


@attack_app.command("exposure")
def attack_exposure_command(
    target: ModelFolderOpt,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="enumerate (exact rank among all candidates), extrapolate (skew-normal fit "
            "to sampled candidates) or auto (enumerate up to --enumerate-limit candidates).",
        ),
    ] = "auto",
    samples: Annotated[
        int,
        typer.Option("--samples", help="Candidates sampled uniformly for the skew-normal fit."),
    ] = 5000,
    enumerate_limit: Annotated[
        int,
        typer.Option("--enumerate-limit", help="Largest space that auto enumerates."),
    ] = 10**6,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampled candidates.")] = 0,
    store: StoreOpt = None,
    device: DeviceOpt = "cpu",
    out: OutOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Rank each planted canary's secret among all candidate secrets by log-perplexity under
    the model (Carlini et al. 2019): exposure = log2|R| - log2 rank, by enumeration or by a
    skew-normal extrapolation. Finished canary formats are stored; a re-run resumes."""

    def run() -> None:
        from privacylab.attacks.language.exposure import METHODS
        from privacylab.lm_exposure import run_exposure

        if method not in METHODS:
            raise PrivacylabError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
        _whole_in(samples, "--samples", low=3)
        _whole_in(enumerate_limit, "--enumerate-limit", high=10**9)
        _whole_in(seed, "--seed", low=0)

        def summary(result: dict[str, Any]) -> Summary:
            for note in result["notes"]:
                _stderr().print(f"note: {note}")
            heading = (
                f"exposure of {len(result['canaries'])} canaries ({result['queries']} queries, "
                f"{result['seconds']:.1f} s; a random canary shows about "
                f"{result['random_exposure']:.2f} bits)"
            )
            return heading, COLUMNS, _rows(result)

        run_language_job(
            target=target,
            out=out,
            json_output=json_output,
            kind="exposure",
            job=lambda stages: run_exposure(
                target,
                method=method,
                samples=samples,
                enumerate_limit=enumerate_limit,
                seed=seed,
                device=_device(device),
                store=store if store is not None else target / STORE,
                progress=stages,
            ),
            summary=summary,
        )

    _guarded(run)
