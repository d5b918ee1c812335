"""ModelSpec and safetensors + JSON sidecar storage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from privacylab.models import FORMAT, ModelError, ModelSpec, build_model, load_model, save_model

SPECS = [
    ModelSpec("logreg", (30,), 2),
    ModelSpec("mlp", (1, 28, 28), 10, {"widths": (32, 16), "activation": "tanh"}),
    ModelSpec("cnn", (3, 32, 32), 10, {"norm": "group"}),
    ModelSpec("lenet", (1, 28, 28), 10),
    ModelSpec("transformer", (16,), 4, {"vocab_size": 40, "dim": 32, "heads": 4, "pad_id": 0}),
]


def inputs(spec: ModelSpec) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if spec.name == "transformer":
        return torch.randint(0, 40, (4, *spec.input_shape), generator=generator)
    return torch.rand(4, *spec.input_shape, generator=generator)


def test_spec_round_trip() -> None:
    spec = SPECS[1]
    assert spec.options["widths"] == [32, 16]
    data = spec.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert ModelSpec.from_dict(data) == spec
    with pytest.raises(ModelError, match="lacks"):
        ModelSpec.from_dict({"name": "mlp"})
    with pytest.raises(ModelError, match="JSON"):
        ModelSpec("mlp", (3,), 2, {"widths": object()})
    with pytest.raises(ModelError):
        ModelSpec("mlp", (1.5,), 2)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_save_load_round_trip(tmp_path: Path, spec: ModelSpec) -> None:
    model = spec.build(seed=3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)
    metadata = {"epsilon": 1.5, "delta": 1e-5, "accountant": "rdp", "config": {"lr": 0.1}}
    folder = save_model(model, tmp_path / "run" / "model", spec, metadata)
    assert sorted(p.name for p in folder.iterdir()) == ["model.json", "model.safetensors"]
    sidecar = json.loads((folder / "model.json").read_text())
    assert sidecar["format"] == FORMAT == "privacylab-model/1"
    assert sidecar["spec"] == spec.to_dict() and sidecar["metadata"] == metadata
    loaded, loaded_spec, loaded_metadata = load_model(folder)
    assert loaded_spec == spec and loaded_metadata == metadata and not loaded.training
    model.eval()
    x = inputs(spec)
    assert torch.equal(model(x), loaded(x))
    again, _, _ = load_model(folder / "model.json")
    assert torch.equal(again(x), model(x))


def test_load_never_unpickles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pickle

    spec = SPECS[0]
    save_model(spec.build(seed=0), tmp_path, spec)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpickling is forbidden")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    load_model(tmp_path)


def test_corrupt_or_missing_files(tmp_path: Path) -> None:
    spec = SPECS[1]
    model = spec.build(seed=0)
    with pytest.raises(ModelError, match="no saved model"):
        load_model(tmp_path / "nothing")
    folder = save_model(model, tmp_path / "m", spec)
    sidecar = folder / "model.json"
    good = sidecar.read_text()

    sidecar.write_text(good[: len(good) // 2])
    with pytest.raises(ModelError, match="corrupt model sidecar") as info:
        load_model(folder)
    assert "\n" not in str(info.value)

    sidecar.write_text(json.dumps({**json.loads(good), "format": "pickle/0"}))
    with pytest.raises(ModelError, match="unsupported format"):
        load_model(folder)

    sidecar.write_text(json.dumps({**json.loads(good), "spec": {"name": "mlp"}}))
    with pytest.raises(ModelError, match="lacks"):
        load_model(folder)

    sidecar.write_text(good)
    weights = folder / "model.safetensors"
    blob = weights.read_bytes()
    weights.write_bytes(blob[:100])
    with pytest.raises(ModelError, match="sha256"):
        load_model(folder)

    unhashed = json.loads(good)
    del unhashed["sha256"]
    sidecar.write_text(json.dumps(unhashed))
    with pytest.raises(ModelError, match="corrupt weights"):
        load_model(folder)

    weights.unlink()
    with pytest.raises(ModelError, match="no weights file"):
        load_model(folder)


def test_weights_not_fitting_spec(tmp_path: Path) -> None:
    spec = ModelSpec("mlp", (1, 28, 28), 10, {"widths": [32]})
    folder = save_model(spec.build(seed=0), tmp_path, spec)
    other = build_model("mlp", (1, 28, 28), 10, widths=[16])
    save_file(
        {k: v.contiguous() for k, v in other.state_dict().items()}, folder / "model.safetensors"
    )
    sidecar = json.loads((folder / "model.json").read_text())
    del sidecar["sha256"]
    (folder / "model.json").write_text(json.dumps(sidecar))
    expected = r"do not fit spec 'mlp': shape: 1\.bias \(16,\) != \(32,\)"
    with pytest.raises(ModelError, match=expected):
        load_model(folder)
    with pytest.raises(ModelError, match="do not fit"):
        save_model(other, tmp_path / "x", spec)


def test_save_rejects_bad_arguments(tmp_path: Path) -> None:
    spec = SPECS[0]
    model = spec.build(seed=0)
    with pytest.raises(ModelError, match="ModelSpec"):
        save_model(model, tmp_path, spec.to_dict())  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="JSON-serialisable"):
        save_model(model, tmp_path, spec, {"tensor": torch.zeros(1)})
    assert not (tmp_path / "model.json").exists()
