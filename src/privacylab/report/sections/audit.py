"""The audit section: empirical ε lower bounds of our DP-SGD against the accountant's ε."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privacylab.report._format import MISSING, e, mappings, number
from privacylab.report.sections import register_section

AUDIT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("method", "method"),
    ("audited", "audited model"),
    ("epsilon_theory", "ε (accountant)"),
    ("epsilon_lower_bound", "ε lower bound"),
    ("confidence", "confidence"),
    ("trials", "trials"),
    ("seconds", "seconds"),
    ("result", "result"),
)
"""(key, header) of each column of the audit table, in display order."""


def _rows(payload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    audit = payload.get("audit")
    return mappings(audit if isinstance(audit, (list, tuple)) else [audit])


def audit_passed(row: Mapping[str, Any]) -> bool | None:
    """True when the ε lower bound is at most the accountant's ε, False when above, None when
    either is missing; `violated`, when present, decides."""
    if isinstance(row.get("violated"), bool):
        return not row["violated"]
    low, high = number(row.get("epsilon_lower_bound")), number(row.get("epsilon_theory"))
    if low is None or high is None:
        return None
    return low <= high


READABLE = {
    "logreg": "logistic regression",
    "mlp": "MLP",
    "digits": "sklearn digits",
    "mnist5k": "mnist5k",
}
"""Plain names of the models and datasets audits train on."""


def _audited(row: Mapping[str, Any]) -> str:
    model, data = row.get("audited_model"), row.get("audited_dataset")
    if model is None and data is None:
        return MISSING
    model, data = READABLE.get(str(model), model or "?"), READABLE.get(str(data), data or "?")
    return f"{model} on {data}"


@register_section
class AuditSection:
    """DP-SGD audits of the run: one row per (ε, method), pass/fail against the accountant."""

    css = """
td.pass { color: #1b7f3b; font-weight: 600; }
td.fail { color: #a40000; font-weight: 700; }
"""
    key = "audit"
    title = "Audit of DP-SGD"
    order = 50

    def applies(self, payload: Mapping[str, Any]) -> bool:
        """Whether the payload holds any audit."""
        return bool(_rows(payload))

    def render(self, folder: Path, payload: Mapping[str, Any]) -> str:
        """The audit table, red where the lower bound refutes the accountant."""
        rows = _rows(payload)
        head = "".join(
            f'<th class="text">{e(h)}</th>' if k in {"method", "audited"} else f"<th>{e(h)}</th>"
            for k, h in AUDIT_COLUMNS
        )
        body = []
        for row in rows:
            passed = audit_passed(row)
            cells = []
            for key, _ in AUDIT_COLUMNS:
                if key == "result":
                    text = {True: "pass", False: "FAIL", None: MISSING}[passed]
                elif key == "audited":
                    text = _audited(row)
                else:
                    value = row.get(key)
                    x = number(value)
                    text = f"{x:.3f}" if x is not None and key != "trials" else value
                    text = MISSING if text is None else str(text)
                klass = ""
                if key in {"method", "audited"}:
                    klass = ' class="text"'
                elif key == "result" and passed is not None:
                    klass = ' class="pass"' if passed else ' class="fail"'
                cells.append(f"<td{klass}>{e(text)}</td>")
            style = ' class="violation"' if passed is False else ""
            body.append(f"<tr{style}>{''.join(cells)}</tr>")
        models = sorted({_audited(r) for r in rows} - {MISSING})
        which = (
            f"The audits train their own model — {', '.join(models)} — with our DP-SGD at "
            "each ε of this run; they test the DP-SGD implementation and its accountant, not "
            "the targets above."
            if models
            else "The audits train their own model with our DP-SGD at each ε of this run."
        )
        note = (
            f"{which} An audit attacks that training to measure a lower bound on ε that holds "
            "with the stated confidence. pass: the lower bound is at most the accountant's ε, "
            "as it must be; FAIL (red): the implementation or its accounting is wrong. A lower "
            "bound far below the accountant's ε is expected for weak audits and is no failure."
        )
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        return (
            f'<section id="{self.key}">\n<h2>{e(self.title)}</h2>\n<p>{e(note)}</p>\n{table}\n'
            "</section>"
        )
