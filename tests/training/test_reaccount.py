"""The trainer accounts the events the DP-SGD engine executed; a saved model records the composed
event, and any accountant can bound it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from privacylab.accounting import (
    Composed,
    Gaussian,
    PldAccountant,
    PoissonSampled,
    SelfComposed,
    dp_sgd,
)
from privacylab.accounting.events import event_from_dict
from privacylab.errors import PrivacylabError
from privacylab.training import DPSGD, PrivacyConfig, TrainConfig, reaccount, train_job

CONFIG = TrainConfig(
    epochs=2, batch_size=256, lr=0.3, privacy=PrivacyConfig(noise_multiplier=1.2, delta=1e-5)
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("reaccount") / "run"
    summary = train_job("digits", "logreg", CONFIG, out)
    return out, summary


def test_the_sidecar_records_the_executed_event(saved) -> None:
    out, summary = saved
    sidecar = json.loads((out / "model.json").read_text())
    event = event_from_dict(sidecar["metadata"]["privacy_event"])
    assert event == dp_sgd(1.2, summary["sample_rate"], summary["steps"])
    assert sidecar["metadata"]["result"]["privacy"]["event"] == event.to_dict()


def test_pld_reaccounting_equals_the_epsilon_reported_at_train_time(saved) -> None:
    out, summary = saved
    guarantee = reaccount(out)
    assert guarantee.accountant == "pld" and guarantee.delta == 1e-5
    assert guarantee.epsilon == summary["epsilon"]
    assert reaccount(out / "model.json").epsilon == summary["epsilon"]
    sidecar = json.loads((out / "model.json").read_text())
    assert reaccount(sidecar).epsilon == summary["epsilon"]
    assert reaccount(sidecar["metadata"], accountant="pld").epsilon == summary["epsilon"]


def test_rdp_is_an_upper_bound_no_tighter_than_pld(saved) -> None:
    out, summary = saved
    rdp = reaccount(out, accountant="rdp")
    assert rdp.accountant == "rdp" and rdp.epsilon >= summary["epsilon"]
    assert reaccount(out, delta=1e-3).epsilon < summary["epsilon"]


@pytest.mark.parametrize(
    ("sidecar", "message"),
    [
        ({"metadata": {"summary": {"delta": 1e-5}}}, "no privacy event"),
        ({"metadata": {"privacy_event": {"type": "bogus"}}}, "invalid"),
        ({"metadata": {"privacy_event": Gaussian(1.0).to_dict()}}, "no delta"),
        (
            {"metadata": {"privacy_event": Gaussian(1.0).to_dict(), "summary": {"delta": 2}}},
            "delta",
        ),
        ({"metadata": []}, "not an object"),
    ],
)
def test_bad_sidecars_are_one_line(sidecar, message) -> None:
    with pytest.raises(PrivacylabError, match=message) as error:
        reaccount(sidecar)
    assert "\n" not in str(error.value)


def test_unreadable_sidecar_is_one_line(tmp_path) -> None:
    (tmp_path / "model.json").write_text("{not json")
    with pytest.raises(PrivacylabError, match="cannot read"):
        reaccount(tmp_path)
    with pytest.raises(PrivacylabError, match="cannot read"):
        reaccount(tmp_path / "missing")


def test_the_engine_composes_the_events_it_ran_when_sigma_changes() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    engine = DPSGD(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="none"),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=4.0,
        sample_rate=0.1,
        generator=torch.Generator().manual_seed(0),
    )
    x, y = torch.randn(4, 4), torch.randint(0, 3, (4,))
    for _ in range(3):
        engine.step(x, y)
    engine.noise_multiplier = 2.0
    engine.step(x, y)
    first, second = PoissonSampled(0.1, Gaussian(1.0)), PoissonSampled(0.1, Gaussian(2.0))
    assert engine.privacy_event == Composed([SelfComposed(first, 3), SelfComposed(second, 1)])
    separate = PldAccountant().compose(first, 3).compose(second).epsilon(1e-5)
    assert PldAccountant().compose(engine.privacy_event).epsilon(1e-5) == pytest.approx(separate)
    engine.noise_multiplier = 0.0
    engine.step(x, y)
    with pytest.raises(PrivacylabError, match="no privacy guarantee"):
        _ = engine.privacy_event
