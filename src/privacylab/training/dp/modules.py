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
  at once, the hidden projection one Linear called once per time step on (B, h) (ghost
  clipping handles a layer called several times by treating the calls as a sequence axis), and
  the LSTM projection (``proj_size``, Sak et al. 2014) one more.  The recurrences are those of
  the PyTorch documentation of nn.RNN, nn.LSTM (Hochreiter & Schmidhuber 1997, with the forget
  gate of Gers et al. 2000) and nn.GRU (Cho et al. 2014), in the same gate order, so a stock
  module's weights load unchanged (``from_module`` or ``load_state_dict`` of the stock state
  dict) and the outputs are equal.  A PackedSequence is unpacked to a padded batch and each
  example's steps past its length are masked out, so they contribute nothing to its gradient.
  Ghost clipping probes the model on 1 and 2 examples and needs the same layer calls in both;
  a PackedSequence has as many steps as its longest sequence, which differs between them, so
  for DP training pass the padded batch with ``lengths=`` (same masking, fixed T) instead.
* attention: scaled dot-product multi-head attention (Vaswani et al. 2017, Sec. 3.2) with
  separate q/k/v/out Linear projections, the same masks and outputs as nn.MultiheadAttention.

Everything is computed batch-first internally (a sequence-first input is transposed first), so
every Linear sees the batch in dimension 0 even when T equals B.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from privacylab.training.dp.errors import DPSGDError, check_count

__all__ = [
    "DPGRU",
    "DPLSTM",
    "DPRNN",
    "DPMultiheadAttention",
    "DPRNNBase",
    "RecurrentCell",
]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
_STOCK_KEY = re.compile(r"^(weight|bias)_(ih|hh|hr)_l(\d+)(_reverse)?$")


def _stock_to_dp_name(name: str) -> str | None:
    """``weight_ih_l1_reverse`` -> ``l1_reverse.ih.weight`` (None for other names)."""
    match = _STOCK_KEY.match(name)
    if match is None:
        return None
    kind, projection, layer, reverse = match.groups()
    return f"l{layer}{reverse or ''}.{projection}.{kind}"


class RecurrentCell(nn.Module):
    """One layer and direction of a recurrent network: its Linear projections.

    ``ih`` holds the stock ``weight_ih_l{k}`` / ``bias_ih_l{k}``, ``hh`` the ``weight_hh_l{k}`` /
    ``bias_hh_l{k}``, with the gates stacked in the stock order (LSTM: i, f, g, o; GRU: r, z, n);
    ``hr`` (LSTM with ``proj_size`` only) the projection ``weight_hr_l{k}``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        gates: int,
        bias: bool,
        proj_size: int = 0,
        **factory: Any,
    ) -> None:
        super().__init__()
        self.ih = nn.Linear(input_size, gates * hidden_size, bias=bias, **factory)
        self.hh = nn.Linear(proj_size or hidden_size, gates * hidden_size, bias=bias, **factory)
        if proj_size:
            self.hr = nn.Linear(hidden_size, proj_size, bias=False, **factory)


class DPRNNBase(nn.Module, ABC):
    """Shared machinery of :class:`DPRNN`, :class:`DPLSTM` and :class:`DPGRU`.

    Same constructor arguments, attributes, call signature and outputs as the stock module,
    including unbatched (T, d) inputs and PackedSequence inputs (unpacked to a padded batch;
    each example's state stops changing after its last step, the reverse direction reads each
    sequence backwards from its own last step, and the output is packed like the input).
    Parameters are named ``l{k}[_reverse].ih.weight`` etc.; a stock state dict
    (``weight_ih_l0`` ...) is renamed when loaded.
    """

    mode: str = ""
    stock: ClassVar[type[nn.RNNBase]]
    """The stock module this class replaces."""

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
        name = type(self).__name__
        for label, value in (
            ("input_size", input_size),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
        ):
            check_count(f"{name} {label}", value)
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0.0 <= float(dropout) <= 1.0
        ):
            raise DPSGDError(f"{name} dropout must be in [0, 1], got {dropout!r}")
        if isinstance(proj_size, bool) or not isinstance(proj_size, int) or proj_size < 0:
            raise DPSGDError(f"{name} proj_size must be a whole number >= 0, got {proj_size!r}")
        if proj_size and self.mode != "LSTM":
            raise DPSGDError(f"{name} has no proj_size (only DPLSTM has), got {proj_size}")
        if proj_size >= hidden_size:
            raise DPSGDError(
                f"{name} proj_size={proj_size} must be smaller than hidden_size={hidden_size}"
            )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        self.drop = nn.Dropout(self.dropout)
        gates = _GATES[self.mode]
        directions = 2 if bidirectional else 1
        factory = {"device": device, "dtype": dtype}
        for layer in range(num_layers):
            width = input_size if layer == 0 else self._output_size * directions
            for direction in range(directions):
                cell = RecurrentCell(width, hidden_size, gates, bias, proj_size, **factory)
                self.add_module(self._cell_name(layer, direction), cell)
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(self._rename_stock_keys)

    @property
    def _output_size(self) -> int:
        return self.proj_size or self.hidden_size

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
        for label, default in (
            ("bias", True),
            ("batch_first", False),
            ("dropout", 0.0),
            ("bidirectional", False),
            ("proj_size", 0),
        ):
            if getattr(self, label) != default:
                parts.append(f"{label}={getattr(self, label)}")
        return ", ".join(parts)

    @staticmethod
    def _rename_stock_keys(state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            new = _stock_to_dp_name(key[len(prefix) :])
            if new is not None:
                state_dict[prefix + new] = state_dict.pop(key)

    @classmethod
    def from_module(cls, stock: nn.RNNBase) -> DPRNNBase:
        """A copy of ``stock`` (same configuration, weights, dtype, device, mode, frozen
        parameters) whose output equals the stock module's."""
        expected = cls.stock
        if not isinstance(stock, expected):
            raise DPSGDError(
                f"{cls.__name__}.from_module needs an nn.{expected.__name__}, got "
                f"{type(stock).__name__}"
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
        if stock.proj_size:
            kwargs["proj_size"] = stock.proj_size
        module = cls(stock.input_size, stock.hidden_size, **kwargs)
        module.load_state_dict(stock.state_dict())
        frozen = {_stock_to_dp_name(n) for n, p in stock.named_parameters() if not p.requires_grad}
        for name, param in module.named_parameters():
            param.requires_grad_(name not in frozen)
        module.train(stock.training)
        return module

    def _initial_state(
        self, hx: Tensor | None, batch: int, x: Tensor, what: str, size: int
    ) -> Tensor:
        """(layers·directions, B, size) initial state, zeros when not given."""
        shape = (self.num_layers * (2 if self.bidirectional else 1), batch, size)
        if hx is None:
            return x.new_zeros(shape)
        if not isinstance(hx, Tensor) or tuple(hx.shape) != shape:
            got = tuple(hx.shape) if isinstance(hx, Tensor) else type(hx).__name__
            raise DPSGDError(f"{type(self).__name__} expected {what} of shape {shape}, got {got}")
        return hx

    @abstractmethod
    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, Tensor | None]:
        """One time step from the projected input (B, G·h) and the previous state."""

    def _run(
        self, x: Tensor, h0: Tensor, c0: Tensor | None, lengths: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """All layers on a batch-first (B, T, d) input; states are (L·D, B, ·).

        With ``lengths`` (B,), example i has steps 0..lengths[i]−1: later steps keep its state
        and output zeros, and the reverse direction reads its steps lengths[i]−1, ..., 0.
        """
        directions = 2 if self.bidirectional else 1
        steps = x.shape[1]
        active = backwards = None
        if lengths is not None:
            t = torch.arange(steps, device=x.device)
            active = t[None, :] < lengths[:, None]
            backwards = torch.where(active, lengths[:, None] - 1 - t[None, :], t[None, :])
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0:
                x = self.drop(x)
            outputs = []
            for direction in range(directions):
                cell = self._cell(layer, direction)
                index = layer * directions + direction
                sequence = _reverse(x, backwards) if direction else x
                projected = cell.ih(sequence)
                hidden = h0[index]
                state = None if c0 is None else c0[index]
                out = []
                for step in range(steps):
                    new_hidden, new_state = self._step(projected[:, step], hidden, state, cell)
                    if active is None:
                        hidden, state = new_hidden, new_state
                        out.append(hidden)
                        continue
                    keep = active[:, step, None]
                    hidden = torch.where(keep, new_hidden, hidden)
                    if state is not None and new_state is not None:
                        state = torch.where(keep, new_state, state)
                    out.append(torch.where(keep, new_hidden, torch.zeros_like(new_hidden)))
                result = torch.stack(out, 1)
                outputs.append(_reverse(result, backwards) if direction else result)
                h_n.append(hidden)
                if state is not None:
                    c_n.append(state)
            x = outputs[0] if directions == 1 else torch.cat(outputs, 2)
        return x, torch.stack(h_n), torch.stack(c_n) if c_n else None

    def _forward(
        self,
        input: Tensor | PackedSequence,
        h0: Tensor | None,
        c0: Tensor | None,
        what: str,
        lengths: Tensor | None,
    ) -> tuple[Tensor | PackedSequence, Tensor, Tensor | None]:
        """Checks, layout (batch-first inside), initial states, all layers, layout back."""
        name = type(self).__name__
        packed = input if isinstance(input, PackedSequence) else None
        if lengths is not None and (not isinstance(input, Tensor) or input.dim() != 3):
            raise DPSGDError(f"{name} takes lengths= only with a padded 3-D input tensor")
        if packed is not None:
            x, lengths = pad_packed_sequence(packed, batch_first=True)
            lengths = lengths.to(x.device)
        elif isinstance(input, Tensor) and input.dim() in (2, 3):
            x = input
        else:
            got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise DPSGDError(f"{name} expects a 2-D or 3-D input tensor, got {got}")
        if x.shape[-1] != self.input_size:
            raise DPSGDError(
                f"{name} expects input_size={self.input_size} features, got {x.shape[-1]}"
            )
        unbatched = packed is None and x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0)
            h0 = h0.unsqueeze(1) if isinstance(h0, Tensor) and h0.dim() == 2 else h0
            c0 = c0.unsqueeze(1) if isinstance(c0, Tensor) and c0.dim() == 2 else c0
        elif packed is None and not self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[1] == 0:
            raise DPSGDError(f"{name} needs sequences of length >= 1")
        batch = x.shape[0]
        if lengths is not None and packed is None:
            lengths = _check_lengths(name, lengths, batch, x.shape[1], x.device)
        h0 = self._initial_state(h0, batch, x, what, self._output_size)
        if self.mode == "LSTM":
            c0 = self._initial_state(c0, batch, x, "c_0", self.hidden_size)
        out, h_n, c_n = self._run(x, h0, c0, lengths)
        if unbatched:
            return out.squeeze(0), h_n.squeeze(1), None if c_n is None else c_n.squeeze(1)
        if packed is not None:
            assert lengths is not None
            order = packed.sorted_indices
            if order is not None:
                out, lengths = out.index_select(0, order), lengths.index_select(0, order)
            data = pack_padded_sequence(out, lengths.cpu(), batch_first=True).data
            result = PackedSequence(
                data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices
            )
            return result, h_n, c_n
        return (out if self.batch_first else out.transpose(0, 1)), h_n, c_n


def _check_lengths(name: str, lengths: object, batch: int, steps: int, device: object) -> Tensor:
    """``lengths`` as a (B,) integer tensor with values in [1, T], or DPSGDError."""
    if not isinstance(lengths, Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except (TypeError, ValueError, RuntimeError):
            raise DPSGDError(f"{name} lengths must be a (B,) tensor of integers") from None
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or lengths.shape != (batch,):
        raise DPSGDError(
            f"{name} lengths must be a ({batch},) integer tensor, got {lengths.dtype} of shape "
            f"{tuple(lengths.shape)}"
        )
    lengths = lengths.to(device=device, dtype=torch.long)
    try:
        bad = bool(((lengths < 1) | (lengths > steps)).any())
    except RuntimeError:  # inside torch.func.vmap values cannot be inspected: gather checks > T
        bad = False
    if bad:
        raise DPSGDError(f"{name} lengths must lie in [1, {steps}], got {lengths.tolist()}")
    return lengths


def _reverse(x: Tensor, backwards: Tensor | None) -> Tensor:
    """Each sequence of a (B, T, ·) batch reversed: whole rows, or within its own length."""
    if backwards is None:
        return x.flip(1)
    return x.gather(1, backwards[:, :, None].expand(-1, -1, x.shape[2]))


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

    stock = nn.RNN

    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, None]:
        pre = projected + cell.hh(hidden)
        return (torch.tanh(pre) if self.nonlinearity == "tanh" else torch.relu(pre)), None

    def forward(
        self,
        input: Tensor | PackedSequence,
        hx: Tensor | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor | PackedSequence, Tensor]:
        """``input`` (T, B, d) — (B, T, d) if batch_first, (T, d) unbatched, or a
        PackedSequence; ``hx`` (L·D, B, h) or (L·D, h).  Returns output (…, D·h) and h_n.

        ``lengths`` (B,), an extension of the stock signature: example i has steps
        0..lengths[i]−1 of the padded input — the PackedSequence computation on a tensor whose
        number of steps does not depend on the batch (which ghost clipping's probe on 1 and 2
        examples needs, and vmap too); its outputs past each length are 0.
        """
        out, h_n, _ = self._forward(input, hx, None, "hx", lengths)
        return out, h_n


class DPGRU(DPRNNBase):
    """Drop-in for nn.GRU (Cho et al. 2014), the PyTorch formulation:
    r = σ(W_ir x + b_ir + W_hr h + b_hr), z = σ(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)), h' = (1 − z) ⊙ n + z ⊙ h.

    ``forward(input, hx=None) -> (output, h_n)``.
    """

    mode = "GRU"

    stock = nn.GRU

    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, None]:
        x_r, x_z, x_n = projected.chunk(3, 1)
        h_r, h_z, h_n = cell.hh(hidden).chunk(3, 1)
        reset = torch.sigmoid(x_r + h_r)
        update = torch.sigmoid(x_z + h_z)
        candidate = torch.tanh(x_n + reset * h_n)
        return candidate + update * (hidden - candidate), None

    def forward(
        self,
        input: Tensor | PackedSequence,
        hx: Tensor | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor | PackedSequence, Tensor]:
        """Same shapes and ``lengths`` as :meth:`DPRNN.forward`."""
        out, h_n, _ = self._forward(input, hx, None, "hx", lengths)
        return out, h_n


class DPLSTM(DPRNNBase):
    """Drop-in for nn.LSTM (Hochreiter & Schmidhuber 1997; forget gate of Gers et al. 2000):
    (i, f, g, o) = (σ, σ, tanh, σ)(W_ih x + b_ih + W_hh h + b_hh), c' = f ⊙ c + i ⊙ g,
    h' = o ⊙ tanh(c'), and with ``proj_size`` h' = W_hr (o ⊙ tanh(c')) (Sak et al. 2014).

    ``forward(input, (h_0, c_0)=None) -> (output, (h_n, c_n))``.
    """

    mode = "LSTM"

    stock = nn.LSTM

    def _step(
        self, projected: Tensor, hidden: Tensor, state: Tensor | None, cell: RecurrentCell
    ) -> tuple[Tensor, Tensor]:
        i, f, g, o = (projected + cell.hh(hidden)).chunk(4, 1)
        state = torch.sigmoid(f) * state + torch.sigmoid(i) * torch.tanh(g)
        hidden = torch.sigmoid(o) * torch.tanh(state)
        if self.proj_size:
            hidden = cell.hr(hidden)
        return hidden, state

    def forward(
        self,
        input: Tensor | PackedSequence,
        hx: tuple[Tensor, Tensor] | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor | PackedSequence, tuple[Tensor, Tensor]]:
        """Same shapes and ``lengths`` as :meth:`DPRNN.forward`, with the state a pair (h, c);
        with ``proj_size`` P, h and the output have P features per direction."""
        h0 = c0 = None
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise DPSGDError("DPLSTM expects hx to be a pair (h_0, c_0)")
            h0, c0 = hx
        out, h_n, c_n = self._forward(input, h0, c0, "h_0", lengths)
        assert c_n is not None
        return out, (h_n, c_n)


class DPMultiheadAttention(nn.Module):
    """Drop-in for nn.MultiheadAttention from four nn.Linear layers (q, k, v, out).

    Scaled dot-product attention (Vaswani et al. 2017, Sec. 3.2.2) with the stock module's
    arguments, masks (boolean: True = not allowed; float: added), attention dropout, zero
    attention and outputs ``(output, weights or None)``; the weights are averaged over heads
    unless ``average_attn_weights=False``.  ``add_bias_kv``'s learned key and value appended to
    every sequence are Linear(1, E) layers applied to a (B, 1, 1) tensor of ones, so that ghost
    clipping's Linear rule covers them too.  ``is_causal=True`` without ``attn_mask`` applies
    the causal mask (the stock module raises instead); with ``attn_mask`` the mask is used as
    given.  A stock state dict (``in_proj_weight``, ``q_proj_weight`` ..., ``in_proj_bias``,
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
        check_count("embed_dim", embed_dim)
        check_count("num_heads", num_heads)
        if embed_dim % num_heads:
            raise DPSGDError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        if not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) <= 1.0:
            raise DPSGDError(f"dropout must be in [0, 1], got {dropout!r}")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = batch_first
        self.add_zero_attn = add_zero_attn
        self.add_bias_kv = add_bias_kv
        self._qkv_same_embed_dim = False
        """No packed ``in_proj_weight``: keeps nn.Transformer* layers off their fused fast path."""
        self.in_proj_weight = self.in_proj_bias = None
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:
            self.k_bias = nn.Linear(1, embed_dim, bias=False, **factory)
            self.v_bias = nn.Linear(1, embed_dim, bias=False, **factory)
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
        if self.add_bias_kv:
            for extra in (self.k_bias, self.v_bias):
                nn.init.normal_(extra.weight, std=1.0 / math.sqrt(self.embed_dim))

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
        for name in ("k", "v"):
            extra = state_dict.pop(f"{prefix}bias_{name}", None)
            if extra is not None:
                state_dict[f"{prefix}{name}_bias.weight"] = extra.reshape(-1, 1)
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
        reference = stock.out_proj.weight
        module = cls(
            stock.embed_dim,
            stock.num_heads,
            dropout=stock.dropout,
            bias=stock.in_proj_bias is not None,
            add_bias_kv=stock.bias_k is not None,
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
            elif projection in ("k_bias", "v_bias"):
                stock_names = {f"bias_{projection[0]}"}
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
        k, v = self.k_proj(key), self.v_proj(value)
        if self.add_bias_kv:
            ones = key.new_ones(batch, 1, 1)
            k = torch.cat([k, self.k_bias(ones)], 1)
            v = torch.cat([v, self.v_bias(ones)], 1)
        keys = k.shape[1]
        k = k.view(batch, keys, heads, width).transpose(1, 2)
        v = v.view(batch, keys, heads, width).transpose(1, 2)
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
        extra = int(self.add_bias_kv) + int(self.add_zero_attn)
        if total is not None and extra:
            total = F.pad(total, (0, extra))
        return total


def _additive(mask: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    """A boolean mask (True = masked) as 0/−inf, a float mask as is."""
    if mask.dtype == torch.bool:
        return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
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
