"""Drop-in replacements for nn.LSTM/GRU/RNN and nn.MultiheadAttention built from nn.Linear.

DP-SGD (Abadi et al. 2016, Alg. 1) needs every example's gradient norm.  Ghost clipping (Li et
al. 2022, "Large language models can be strong differentially private learners") obtains it
from forward hooks on layers it has a rule for, and needs each such layer to see the batch in
dimension 0 and each parameter to be used only through its layer's ``forward``.  The stock
recurrent modules run fused kernels on their parameters and ``nn.MultiheadAttention`` uses its
``in_proj_weight`` through ``F.multi_head_attention_forward``, so neither can be clipped by
hooks (and ``torch.func.vmap`` fails on the GRU and RNN kernels).  The modules here compute the
same functions from ``nn.Linear`` layers only — the approach of Opacus's ``DPLSTM`` and
``DPMultiheadAttention`` — so that the Linear rule of ghost clipping applies to every parameter:

* recurrent layers: the input projection is one Linear applied to the whole (B, T, d) sequence
  at once, the hidden projection one Linear called once per time step on (B, h) (ghost clipping
  handles a layer called several times by treating the calls as a sequence axis).  The
  recurrences are those of the PyTorch documentation of nn.RNN, nn.LSTM (Hochreiter &
  Schmidhuber 1997, with the forget gate of Gers et al. 2000) and nn.GRU (Cho et al. 2014), in
  the same gate order, so a stock module's weights load unchanged (``from_module`` or
  ``load_state_dict`` of the stock state dict) and the outputs are equal.
* attention: scaled dot-product multi-head attention (Vaswani et al. 2017, Sec. 3.2) with
  separate q/k/v/out Linear projections, the same masks and outputs as nn.MultiheadAttention.

Everything is computed batch-first internally (a sequence-first input is transposed first), so
every Linear sees the batch in dimension 0 even when T equals B.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from privacylab.training.dp.errors import DPSGDError

__all__ = [
    "DPGRU",
    "DPLSTM",
    "DPRNN",
    "DPMultiheadAttention",
    "DPRNNBase",
    "RecurrentCell",
]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
_STOCK_KEY = re.compile(r"^(weight|bias)_(ih|hh)_l(\d+)(_reverse)?$")


class RecurrentCell(nn.Module):
    """One layer and direction of a recurrent network: the input and hidden projections.

    ``ih`` holds the stock ``weight_ih_l{k}`` / ``bias_ih_l{k}``, ``hh`` the ``weight_hh_l{k}`` /
    ``bias_hh_l{k}``, with the gates stacked in the stock order (LSTM: i, f, g, o; GRU: r, z, n).
    """

    def __init__(
        self, input_size: int, hidden_size: int, gates: int, bias: bool, **factory: Any
    ) -> None:
        super().__init__()
        self.ih = nn.Linear(input_size, gates * hidden_size, bias=bias, **factory)
        self.hh = nn.Linear(hidden_size, gates * hidden_size, bias=bias, **factory)


class DPRNNBase(nn.Module):
    """Shared machinery of :class:`DPRNN`, :class:`DPLSTM` and :class:`DPGRU`.

    Same constructor arguments, attributes, call signature and outputs as the stock module;
    ``proj_size`` and PackedSequence inputs are refused with one line (pad the batch instead).
    Parameters are named ``l{k}[_reverse].ih.weight`` etc.; a stock state dict
    (``weight_ih_l0`` ...) is renamed when loaded.
    """

    mode: str = ""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("input_size", input_size),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DPSGDError(
                    f"{type(self).__name__} {name} must be a whole number >= 1, got {value!r}"
                )
        if not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) <= 1.0:
            raise DPSGDError(f"{type(self).__name__} dropout must be in [0, 1], got {dropout!r}")
        if proj_size:
            raise DPSGDError(
                f"{type(self).__name__} does not support proj_size={proj_size!r}; use "
                "proj_size=0 and a Linear layer on the outputs"
            )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = 0
        self.drop = nn.Dropout(self.dropout)
        gates = _GATES[self.mode]
        directions = 2 if bidirectional else 1
        factory = {"device": device, "dtype": dtype}
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            for direction in range(directions):
                cell = RecurrentCell(width, hidden_size, gates, bias, **factory)
                self.add_module(self._cell_name(layer, direction), cell)
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(self._rename_stock_keys)

    @staticmethod
    def _cell_name(layer: int, direction: int) -> str:
        return f"l{layer}" + ("_reverse" if direction else "")

    def _cell(self, layer: int, direction: int) -> RecurrentCell:
        return getattr(self, self._cell_name(layer, direction))

    def reset_parameters(self) -> None:
        """U(−1/√h, 1/√h) for every weight and bias, the stock initialisation."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for param in self.parameters():
            nn.init.uniform_(param, -bound, bound)

    def flatten_parameters(self) -> None:
        """No-op, for code written for the stock module (there is no fused weight buffer)."""

    def extra_repr(self) -> str:
        parts = [f"{self.input_size}, {self.hidden_size}"]
        if self.num_layers != 1:
            parts.append(f"num_layers={self.num_layers}")
        for name, default in (
            ("bias", True),
            ("batch_first", False),
            ("dropout", 0.0),
            ("bidirectional", False),
        ):
            if getattr(self, name) != default:
                parts.append(f"{name}={getattr(self, name)}")
        return ", ".join(parts)

    @staticmethod
    def _rename_stock_keys(state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            match = _STOCK_KEY.match(key[len(prefix) :])
            if match is None:
                continue
            kind, projection, layer, reverse = match.groups()
            new = f"{prefix}l{layer}{reverse or ''}.{projection}.{kind}"
            state_dict[new] = state_dict.pop(key)

    @classmethod
    def stock_type(cls) -> type[nn.RNNBase]:
        """The stock module this class replaces."""
        raise NotImplementedError

    @classmethod
    def from_module(cls, stock: nn.RNNBase) -> DPRNNBase:
        """A copy of ``stock`` (same configuration, weights, dtype, device, mode, frozen
        parameters) whose output equals the stock module's."""
        expected = cls.stock_type()
        if not isinstance(stock, expected):
            raise DPSGDError(
                f"{cls.__name__}.from_module needs an nn.{expected.__name__}, got "
                f"{type(stock).__name__}"
            )
        if getattr(stock, "proj_size", 0):
            raise DPSGDError(
                f"{cls.__name__} cannot replace {type(stock).__name__} with proj_size="
                f"{stock.proj_size}; use proj_size=0 and a Linear layer on the outputs"
            )
        reference = next(iter(stock.parameters()))
        kwargs: dict[str, Any] = {
            "num_layers": stock.num_layers,
            "bias": stock.bias,
            "batch_first": stock.batch_first,
            "dropout": stock.dropout,
            "bidirectional": stock.bidirectional,
            "device": reference.device,
            "dtype": reference.dtype,
        }
        if cls is DPRNN:
            kwargs["nonlinearity"] = "relu" if stock.mode == "RNN_RELU" else "tanh"
        module = cls(stock.input_size, stock.hidden_size, **kwargs)
        state = stock.state_dict()
        module.load_state_dict(state)
        frozen = {n for n, p in stock.named_parameters() if not p.requires_grad}
        renamed = {}
        for name in frozen:
            kind, projection, layer, reverse = _STOCK_KEY.match(name).groups()  # type: ignore[union-attr]
            renamed[f"l{layer}{reverse or ''}.{projection}.{kind}"] = name
        for name, param in module.named_parameters():
            param.requires_grad_(name not in renamed)
        module.train(stock.training)
        return module

    def _initial_state(self, hx: Tensor | None, batch: int, x: Tensor, what: str) -> Tensor:
        """(layers·directions, B, h) initial state, zeros when not given."""
        shape = (self.num_layers * (2 if self.bidirectional else 1), batch, self.hidden_size)
        if hx is None:
            return x.new_zeros(shape)
        if not isinstance(hx, Tensor) or tuple(hx.shape) != shape:
            got = tuple(hx.shape) if isinstance(hx, Tensor) else type(hx).__name__
            raise DPSGDError(f"{type(self).__name__} expected {what} of shape {shape}, got {got}")
        return hx

    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, Tensor | None]:
        """One time step from the projected input (B, G·h) and the previous state."""
        raise NotImplementedError

    def _run(
        self, x: Tensor, h0: Tensor, c0: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """All layers on a batch-first (B, T, d) input; states are (L·D, B, h)."""
        directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0:
                x = self.drop(x)
            outputs = []
            for direction in range(directions):
                cell = self._cell(layer, direction)
                index = layer * directions + direction
                sequence = x.flip(1) if direction else x
                projected = cell.ih(sequence)
                hidden = h0[index]
                state = None if c0 is None else c0[index]
                steps = []
                for t in range(projected.shape[1]):
                    hidden, state = self._step(projected[:, t], hidden, state, cell)
                    steps.append(hidden)
                out = torch.stack(steps, 1)
                outputs.append(out.flip(1) if direction else out)
                h_n.append(hidden)
                if state is not None:
                    c_n.append(state)
            x = outputs[0] if directions == 1 else torch.cat(outputs, 2)
        return x, torch.stack(h_n), torch.stack(c_n) if c_n else None

    def _prepare(self, input: Tensor) -> tuple[Tensor, bool]:
        """The input as batch-first (B, T, d), and whether it was unbatched (T, d)."""
        name = type(self).__name__
        if isinstance(input, PackedSequence):
            raise DPSGDError(
                f"{name} does not take a PackedSequence; pass the padded batch (and mask or "
                "gather the outputs at each sequence's length)"
            )
        if not isinstance(input, Tensor) or input.dim() not in (2, 3):
            got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise DPSGDError(f"{name} expects a 2-D or 3-D input tensor, got {got}")
        if input.shape[-1] != self.input_size:
            raise DPSGDError(
                f"{name} expects input_size={self.input_size} features, got {input.shape[-1]}"
            )
        unbatched = input.dim() == 2
        if unbatched:
            x = input.unsqueeze(0)
        else:
            x = input if self.batch_first else input.transpose(0, 1)
        if x.shape[1] == 0:
            raise DPSGDError(f"{name} needs sequences of length >= 1")
        return x, unbatched

    def _finish(self, out: Tensor, unbatched: bool) -> Tensor:
        if unbatched:
            return out.squeeze(0)
        return out if self.batch_first else out.transpose(0, 1)


class DPRNN(DPRNNBase):
    """Drop-in for nn.RNN: h_t = act(W_ih x_t + b_ih + W_hh h_{t−1} + b_hh), act tanh or relu.

    ``forward(input, hx=None) -> (output, h_n)``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise DPSGDError(f"DPRNN nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        self.mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            device=device,
            dtype=dtype,
        )

    @classmethod
    def stock_type(cls) -> type[nn.RNNBase]:
        return nn.RNN

    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, None]:
        pre = projected + cell.hh(hidden)
        return (torch.tanh(pre) if self.nonlinearity == "tanh" else torch.relu(pre)), None

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``input`` (T, B, d) — (B, T, d) if batch_first, (T, d) unbatched; ``hx``
        (L·D, B, h) or (L·D, h).  Returns output (…, D·h) and h_n like nn.RNN."""
        x, unbatched = self._prepare(input)
        if unbatched and hx is not None and hx.dim() == 2:
            hx = hx.unsqueeze(1)
        h0 = self._initial_state(hx, x.shape[0], x, "hx")
        out, h_n, _ = self._run(x, h0, None)
        return self._finish(out, unbatched), h_n.squeeze(1) if unbatched else h_n


class DPGRU(DPRNNBase):
    """Drop-in for nn.GRU (Cho et al. 2014), the PyTorch formulation:
    r = σ(W_ir x + b_ir + W_hr h + b_hr), z = σ(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)), h' = (1 − z) ⊙ n + z ⊙ h.

    ``forward(input, hx=None) -> (output, h_n)``.
    """

    mode = "GRU"

    @classmethod
    def stock_type(cls) -> type[nn.RNNBase]:
        return nn.GRU

    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, None]:
        x_r, x_z, x_n = projected.chunk(3, 1)
        h_r, h_z, h_n = cell.hh(hidden).chunk(3, 1)
        reset = torch.sigmoid(x_r + h_r)
        update = torch.sigmoid(x_z + h_z)
        candidate = torch.tanh(x_n + reset * h_n)
        return candidate + update * (hidden - candidate), None

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Same shapes as :meth:`DPRNN.forward`."""
        x, unbatched = self._prepare(input)
        if unbatched and hx is not None and hx.dim() == 2:
            hx = hx.unsqueeze(1)
        h0 = self._initial_state(hx, x.shape[0], x, "hx")
        out, h_n, _ = self._run(x, h0, None)
        return self._finish(out, unbatched), h_n.squeeze(1) if unbatched else h_n


class DPLSTM(DPRNNBase):
    """Drop-in for nn.LSTM (Hochreiter & Schmidhuber 1997; forget gate of Gers et al. 2000):
    (i, f, g, o) = (σ, σ, tanh, σ)(W_ih x + b_ih + W_hh h + b_hh), c' = f ⊙ c + i ⊙ g,
    h' = o ⊙ tanh(c').

    ``forward(input, (h_0, c_0)=None) -> (output, (h_n, c_n))``; ``proj_size`` is refused.
    """

    mode = "LSTM"

    @classmethod
    def stock_type(cls) -> type[nn.RNNBase]:
        return nn.LSTM

    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, Tensor]:
        i, f, g, o = (projected + cell.hh(hidden)).chunk(4, 1)
        state = torch.sigmoid(f) * state + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(state), state

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Same shapes as :meth:`DPRNN.forward`, with the state a pair (h, c)."""
        x, unbatched = self._prepare(input)
        h0 = c0 = None
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise DPSGDError("DPLSTM expects hx to be a pair (h_0, c_0)")
            h0, c0 = hx
            if unbatched:
                h0 = h0.unsqueeze(1) if isinstance(h0, Tensor) and h0.dim() == 2 else h0
                c0 = c0.unsqueeze(1) if isinstance(c0, Tensor) and c0.dim() == 2 else c0
        h0 = self._initial_state(h0, x.shape[0], x, "h_0")
        c0 = self._initial_state(c0, x.shape[0], x, "c_0")
        out, h_n, c_n = self._run(x, h0, c0)
        assert c_n is not None
        if unbatched:
            return self._finish(out, True), (h_n.squeeze(1), c_n.squeeze(1))
        return self._finish(out, False), (h_n, c_n)


class DPMultiheadAttention(nn.Module):
    """Drop-in for nn.MultiheadAttention from four nn.Linear layers (q, k, v, out).

    Scaled dot-product attention (Vaswani et al. 2017, Sec. 3.2.2) with the stock module's
    arguments, masks (boolean: True = not allowed; float: added), attention dropout, zero
    attention and outputs ``(output, weights or None)``; the weights are averaged over heads
    unless ``average_attn_weights=False``.  ``add_bias_kv`` is refused (its parameters are used
    outside any Linear).  ``is_causal=True`` without ``attn_mask`` applies the causal mask
    (the stock module raises instead); with ``attn_mask`` the mask is used as given.
    A stock state dict (``in_proj_weight``, ``q_proj_weight`` ..., ``in_proj_bias``,
    ``out_proj.*``) is split into the four projections when loaded.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(embed_dim, bool) or not isinstance(embed_dim, int) or embed_dim < 1:
            raise DPSGDError(f"embed_dim must be a whole number >= 1, got {embed_dim!r}")
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise DPSGDError(f"num_heads must be a whole number >= 1, got {num_heads!r}")
        if embed_dim % num_heads:
            raise DPSGDError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        if not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) <= 1.0:
            raise DPSGDError(f"dropout must be in [0, 1], got {dropout!r}")
        if add_bias_kv:
            raise DPSGDError(
                "DPMultiheadAttention does not support add_bias_kv=True (bias_k/bias_v are used "
                "outside any Linear layer); use add_bias_kv=False"
            )
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = batch_first
        self.add_zero_attn = add_zero_attn
        self.bias_k = self.bias_v = None
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self._reset_parameters()
        self._register_load_state_dict_pre_hook(self._rename_stock_keys)

    def _reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as the stock module initialises them."""
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @staticmethod
    def _rename_stock_keys(state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        names = ("q_proj", "k_proj", "v_proj")
        packed = state_dict.pop(prefix + "in_proj_weight", None)
        if packed is not None:
            for name, part in zip(names, packed.chunk(3, 0), strict=True):
                state_dict[f"{prefix}{name}.weight"] = part
        for name in names:
            separate = state_dict.pop(f"{prefix}{name}_weight", None)
            if separate is not None:
                state_dict[f"{prefix}{name}.weight"] = separate
        bias = state_dict.pop(prefix + "in_proj_bias", None)
        if bias is not None:
            for name, part in zip(names, bias.chunk(3, 0), strict=True):
                state_dict[f"{prefix}{name}.bias"] = part

    @classmethod
    def from_module(cls, stock: nn.MultiheadAttention) -> DPMultiheadAttention:
        """A copy of ``stock`` (configuration, weights, dtype, device, mode, frozen
        parameters) whose outputs equal the stock module's."""
        if not isinstance(stock, nn.MultiheadAttention):
            raise DPSGDError(
                "DPMultiheadAttention.from_module needs an nn.MultiheadAttention, got "
                f"{type(stock).__name__}"
            )
        if stock.bias_k is not None:
            raise DPSGDError(
                "DPMultiheadAttention cannot replace an nn.MultiheadAttention with "
                "add_bias_kv=True (bias_k/bias_v are used outside any Linear layer)"
            )
        reference = stock.out_proj.weight
        module = cls(
            stock.embed_dim,
            stock.num_heads,
            dropout=stock.dropout,
            bias=stock.in_proj_bias is not None,
            add_zero_attn=stock.add_zero_attn,
            kdim=stock.kdim,
            vdim=stock.vdim,
            batch_first=stock.batch_first,
            device=reference.device,
            dtype=reference.dtype,
        )
        module.load_state_dict(stock.state_dict())
        frozen = {n for n, p in stock.named_parameters() if not p.requires_grad}
        for name, param in module.named_parameters():
            projection, kind = name.split(".")
            if projection == "out_proj":
                stock_names = {name}
            elif kind == "bias":
                stock_names = {"in_proj_bias"}
            else:
                stock_names = {"in_proj_weight", f"{projection}_weight"}
            param.requires_grad_(not (stock_names & frozen))
        module.train(stock.training)
        return module

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of ``query`` (L, B, E) over ``key``/``value`` (S, B, kdim/vdim) — (B, ·, ·)
        if batch_first, (L, E)/(S, ·) unbatched.

        Args:
            key_padding_mask: (B, S) (or (S,) unbatched), True/−inf where a key is padding.
            attn_mask: (L, S) or (B·num_heads, L, S), True/−inf where attention is not allowed.

        Returns:
            ``(output, weights)``: output shaped like ``query`` with E features; weights
            (B, L, S) averaged over heads or (B, num_heads, L, S), or None when not needed.
        """
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if not isinstance(tensor, Tensor) or tensor.dim() not in (2, 3):
                got = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
                raise DPSGDError(f"DPMultiheadAttention {name} must be 2-D or 3-D, got {got}")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        batch, target, source = query.shape[0], query.shape[1], key.shape[1]
        if key.shape[:2] != value.shape[:2] or key.shape[0] != batch:
            raise DPSGDError(
                f"DPMultiheadAttention key {tuple(key.shape)} and value {tuple(value.shape)} "
                f"do not match query {tuple(query.shape)} (batch-first view)"
            )
        heads, width = self.num_heads, self.head_dim
        q = self.q_proj(query).view(batch, target, heads, width).transpose(1, 2)
        k = self.k_proj(key).view(batch, source, heads, width).transpose(1, 2)
        v = self.v_proj(value).view(batch, source, heads, width).transpose(1, 2)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(batch, heads, 1, width)], 2)
            v = torch.cat([v, v.new_zeros(batch, heads, 1, width)], 2)
        scores = (q * (1.0 / math.sqrt(width))) @ k.transpose(-1, -2)
        if attn_mask is None and is_causal:
            attn_mask = torch.ones(target, source, dtype=torch.bool, device=q.device).triu(1)
        mask = self._mask(attn_mask, key_padding_mask, batch, target, source, q.dtype)
        if mask is not None:
            scores = scores + mask
        weights = F.dropout(torch.softmax(scores, -1), self.dropout, self.training)
        out = (weights @ v).transpose(1, 2).reshape(batch, target, self.embed_dim)
        out = self.out_proj(out)
        if unbatched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(1)
        return out, weights.squeeze(0) if unbatched else weights

    def _mask(
        self,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        batch: int,
        target: int,
        source: int,
        dtype: torch.dtype,
    ) -> Tensor | None:
        """Additive (B or 1, H or 1, L, S') mask from both masks (S' counts the zero key)."""
        total = None
        if attn_mask is not None:
            mask = _additive(attn_mask, dtype, "attn_mask")
            if mask.dim() == 2 and tuple(mask.shape) == (target, source):
                mask = mask[None, None]
            elif mask.dim() == 3 and tuple(mask.shape) == (batch * self.num_heads, target, source):
                mask = mask.view(batch, self.num_heads, target, source)
            else:
                raise DPSGDError(
                    f"attn_mask must be ({target}, {source}) or ({batch * self.num_heads}, "
                    f"{target}, {source}), got {tuple(attn_mask.shape)}"
                )
            total = mask
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (batch, source):
                raise DPSGDError(
                    f"key_padding_mask must be ({batch}, {source}), got "
                    f"{tuple(key_padding_mask.shape)}"
                )
            padding = _additive(key_padding_mask, dtype, "key_padding_mask")[:, None, None]
            total = padding if total is None else total + padding
        if total is not None and self.add_zero_attn:
            total = F.pad(total, (0, 1))
        return total


def _additive(mask: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    """A boolean mask (True = masked) as 0/−inf, a float mask as is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            mask, float("-inf")
        )
    if not mask.is_floating_point():
        raise DPSGDError(f"{name} must be a bool or float tensor, got {mask.dtype}")
    return mask.to(dtype)


REPLACEMENTS: Mapping[type[nn.Module], type[nn.Module]] = {
    nn.LSTM: DPLSTM,
    nn.GRU: DPGRU,
    nn.RNN: DPRNN,
    nn.MultiheadAttention: DPMultiheadAttention,
}
"""Stock module type -> its drop-in replacement (exact types; used by the validator)."""
