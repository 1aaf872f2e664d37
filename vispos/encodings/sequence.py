"""1D sinusoidal encodings for sequence Transformers: fixed, scaled, and learnable-sinusoidal.

Both modules add an encoding to token embeddings ``(B, L, D)`` (or ``(L, B, D)`` with
``batch_first=False``, the layout of PyTorch's Transformer tutorial). The sinusoids come from the
N-D core :func:`vispos._sincos.sincos_embed`; these modules only choose the positions, manage the
cached table and combine it with the input.

References:
    Vaswani et al., Attention Is All You Need, NeurIPS 2017 (section 3.5: "interleaved", the
    standard ladder); tensor2tensor ``get_timing_signal_1d`` ("split", ``ladder="t2t"``; its
    comment notes that this differs from the paper, tensor2tensor PR 177) and fairseq2
    ``SinusoidalPositionEncoder`` ("initialized as in tensor2tensor"); speechain
    ``PositionalEncoding`` (``posenc_type="sep"``: ``ladder="continued"``, and the order
    LayerNorm, then scale); Li et al., Neural Speech Synthesis with Transformer Network, AAAI
    2019 (the learnable scale ``alpha``); Wang et al., A Simple yet Effective Learnable
    Positional Encoding Method for Improving Document Transformer Model, Findings of AACL 2022.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._sincos import _LADDERS, _LAYOUTS, check_num_feats, check_temperature, sincos_embed
from .. import _deprecation
from .._derived import DerivedBuffers
from .._checks import check_bool, check_choice, check_dropout, check_int, check_number
from ..padding import check_mask

__all__ = ["SinusoidalPositionalEncoding", "LearnableSinusoidalPositionalEncoding"]


def _norm_then_scale(x: Tensor, layernorm: nn.Module | None, emb_scale: bool, dim: int) -> Tensor:
    """``LayerNorm(x) * sqrt(dim)``, each step optional, in speechain's order; never in place.

    Args:
        x (Tensor[..., D]): token embeddings (not modified).
        layernorm (nn.Module, optional): applied first when given.
        emb_scale (bool): then multiply by ``sqrt(dim)`` (Vaswani et al., section 3.4).
        dim (int): ``D``.

    Returns:
        Tensor[..., D]: ``x`` itself when neither step applies, else a new tensor.

    References:
        speechain ``PositionalEncoding.forward`` (steps 1 and 2 of its docstring).
    """
    out = x if layernorm is None else layernorm(x)
    return out * math.sqrt(dim) if emb_scale else out


class _SequenceSinusoid(DerivedBuffers, nn.Module):
    """Shared state of the 1D encoders: the validated options and the cached ``(max_len, D)`` table.

    Not public. Subclasses implement ``forward`` on top of :meth:`_encoding`. The width ``D`` is
    :attr:`dim`; ``_width_name`` is what the constructor calls it (``dim``, vispos' rule, or
    ``d_model`` for the speechain drop-in), used in messages and ``repr``.
    """

    pe: Tensor
    _width_name = "dim"

    def __init__(
        self,
        dim: int,
        *,
        dropout: float,
        max_len: int,
        layout: str,
        batch_first: bool,
        ladder: str,
        temperature: float,
    ) -> None:
        super().__init__()
        dim = check_num_feats(dim, self._width_name)
        dropout = check_dropout(dropout)
        max_len = check_int(max_len, "max_len", minimum=1)
        layout = check_choice(layout, _LAYOUTS, "layout")
        ladder = check_choice(ladder, _LADDERS, "ladder")
        if ladder == "t2t" and dim < 4:
            raise ValueError(f"ladder='t2t' needs {self._width_name} >= 4 (two frequencies at least), got {dim}")
        batch_first = check_bool(batch_first, "batch_first")
        temperature = check_temperature(temperature)
        self.dim = dim
        self.max_len = max_len
        self.layout = layout
        self.batch_first = batch_first
        self.ladder = ladder
        self.temperature = temperature
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", self._embed(torch.arange(max_len, dtype=torch.float32)), persistent=False)

    # -------------------------------------------------------------------------------- helpers
    def _refresh_derived(self) -> None:
        """Rebuilds the sinusoid table ``pe`` in float32 on its device (see DerivedBuffers)."""
        if not self.pe.is_meta:
            positions = torch.arange(self.pe.shape[0], dtype=torch.float32, device=self.pe.device)
            self.pe = self._embed(positions)

    def _embed(self, positions: Tensor, compute_dtype: torch.dtype = torch.float32) -> Tensor:
        """``Tensor[*P, D]`` in ``compute_dtype``: the sinusoids of ``positions``, via the core.

        The "t2t" ladder multiplies by fairseq2's frequencies (its table to the last bit); the
        others divide by the divisors (as Vaswani et al.'s formula, DETR and speechain do).
        """
        return sincos_embed(
            [positions],
            self.dim,
            temperature=self.temperature,
            layout=self.layout,  # type: ignore[arg-type]
            ladder=self.ladder,  # type: ignore[arg-type]
            reciprocal=self.ladder == "t2t",
            channel_dim=-1,
            dtype=compute_dtype,
            compute_dtype=compute_dtype,
        )

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Adds the encoding to ``x``; see the class docstring for shapes and options.

        Args:
            x (Tensor[B, L, D] or Tensor[L, B, D]): token embeddings (not modified).
            positions (Tensor[B, L] or Tensor[L], optional): positions of the steps.
            key_padding_mask (Tensor[B, L], bool, optional): True marks padding; padded steps
                get no encoding and valid steps are counted from 0.

        Returns:
            Tensor: like ``x``, in ``x``'s dtype (half inputs are added in float32, rounded once).
        """
        return self._add_encoding(x, positions, key_padding_mask)

    def _add_encoding(
        self, x: Tensor, positions: Tensor | None, key_padding_mask: Tensor | None, name: str = "x"
    ) -> Tensor:
        """The forward pass; ``name`` is the input's name in error messages."""
        batch, length = self._check_input(x, name)
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        enc, mask = self._encoding(batch, length, x.device, positions, key_padding_mask, compute)
        enc = self._shape_encoding(enc)
        if mask is not None:
            enc = enc.masked_fill(mask.unsqueeze(-1), 0.0)
        out = self._prepare_input(x)
        return self.dropout((out + self._to_input_layout(enc)).to(out.dtype))

    def _shape_encoding(self, enc: Tensor) -> Tensor:
        """Subclass hook: what is done to the raw sinusoid ``(B or 1, L, D)`` before it is added."""
        return enc

    def _prepare_input(self, x: Tensor) -> Tensor:
        """Subclass hook: what is done to the input before the encoding is added."""
        return x

    def _table(self, length: int, device: torch.device) -> Tensor:
        """The first ``length`` rows of the cached table, extending the cache when needed."""
        if length > self.pe.shape[0]:
            self._rebuild_table(length)
        table = self.pe[:length]
        return table if table.device == device else table.to(device)

    def _rebuild_table(self, length: int) -> None:
        """Replaces the cached table by one of ``length`` rows (float32, on its device)."""
        # Rebuilt, not grown in place, so views handed out earlier stay valid. Stays a
        # non-persistent buffer. Built outside inference mode and autograd, so a table first
        # extended under torch.inference_mode() can still serve a training step.
        with torch.inference_mode(False), torch.no_grad():
            positions = torch.arange(length, dtype=torch.float32, device=self.pe.device)
            self.pe = self._embed(positions)

    def _check_input(self, x: object, name: str = "x") -> tuple[int, int]:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor of token embeddings, got {x.dtype}")
        layout = "(B, L, D)" if self.batch_first else "(L, B, D)"
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{name} must have shape {layout} with D = {self._width_name} = {self.dim} "
                f"(batch_first={self.batch_first}), got {tuple(x.shape)}"
            )
        if self.batch_first:
            return x.shape[0], x.shape[1]
        return x.shape[1], x.shape[0]

    def _encoding(
        self,
        batch: int,
        length: int,
        device: torch.device,
        positions: Tensor | None,
        key_padding_mask: Tensor | None,
        compute: torch.dtype = torch.float32,
    ) -> tuple[Tensor, Tensor | None]:
        """The raw sinusoid, ``Tensor[B or 1, L, D]`` in ``compute`` (float32, or float64 for a
        float64 input: then built for the call, not cached), and the checked mask (or None)."""
        if key_padding_mask is not None:
            key_padding_mask = self._check_mask(key_padding_mask, batch, length, device)
        if positions is not None:
            positions = self._check_positions(positions, batch, length, device)
            enc = self._embed(positions, compute)
            return (enc if enc.dim() == 3 else enc.unsqueeze(0)), key_padding_mask
        if key_padding_mask is not None:
            # Count valid steps only: the first valid step is position 0 whatever the padding
            # before it (left padding), padded steps are zeroed by the caller.
            counted = (~key_padding_mask).cumsum(1, dtype=torch.int64) - 1
            return self._embed(counted.clamp_min(0).to(compute), compute), key_padding_mask
        if compute != torch.float32:
            return self._embed(torch.arange(length, dtype=compute, device=device), compute).unsqueeze(0), None
        return self._table(length, device).unsqueeze(0), None

    def _check_positions(self, positions: object, batch: int, length: int, device: torch.device) -> Tensor:
        if not isinstance(positions, Tensor):
            raise TypeError(f"positions must be a Tensor of shape (B, L) or (L,), got {type(positions).__name__}")
        if positions.dtype == torch.bool or positions.is_complex():
            raise TypeError(f"positions must be a real-valued tensor, got {positions.dtype}")
        if tuple(positions.shape) not in ((batch, length), (length,)):
            raise ValueError(
                f"positions must have shape (B, L) = {(batch, length)} or (L,) = {(length,)}, "
                f"got {tuple(positions.shape)}"
            )
        if positions.device != device:
            raise ValueError(f"positions is on {positions.device} but x is on {device}")
        return positions

    @staticmethod
    def _check_mask(mask: object, batch: int, length: int, device: torch.device) -> Tensor:
        check_mask(mask, "key_padding_mask", peer="attention_mask", cells="tokens")
        if tuple(mask.shape) != (batch, length):
            raise ValueError(f"key_padding_mask must have shape (B, L) = {(batch, length)}, got {tuple(mask.shape)}")
        if mask.device != device:
            raise ValueError(f"key_padding_mask is on {mask.device} but x is on {device}")
        return mask

    def _to_input_layout(self, enc: Tensor) -> Tensor:
        return enc if self.batch_first else enc.transpose(0, 1)

    def _common_repr(self) -> str:
        return (
            f"{self._width_name}={self.dim}, dropout={self.dropout.p}, max_len={self.max_len}, "
            f"layout={self.layout!r}, batch_first={self.batch_first}"
        )

    def _ladder_repr(self) -> str:
        return f"ladder={self.ladder!r}, temperature={self.temperature}"


class _DeprecatedDModel:
    """The width's former name (vispos' rule names it ``dim``): ``d_model`` still reads,
    with a ``DeprecationWarning``, for one release."""

    @property
    def d_model(self) -> int:
        """Deprecated: :attr:`dim`."""
        _deprecation.warn(f"{type(self).__name__}.d_model is deprecated and will be removed; use .dim instead")
        return self.dim


class SinusoidalPositionalEncoding(_DeprecatedDModel, _SequenceSinusoid):
    """Adds a fixed sinusoidal encoding to a sequence of token embeddings.

    ``out = dropout(norm(x) * s + alpha * PE(p))``, in speechain's order: ``norm`` is a LayerNorm
    when ``emb_layernorm`` (else identity), then ``s = sqrt(dim)`` when ``emb_scale`` (else 1),
    ``alpha`` is a trained scalar when ``learnable_scale`` (else 1) and ``PE(p)`` embeds position
    ``p`` with ``D / 2`` frequencies ``w_k``, each as a sine and a cosine channel:

    * ``ladder="standard"``: ``w_k = temperature^(-2k / D)`` (Vaswani et al., section 3.5);
    * ``ladder="t2t"``: ``w_j = exp(-ln(temperature) * j / (D/2 - 1))`` (tensor2tensor's
      ``get_timing_signal_1d``, fairseq2), computed with fairseq2's own expression;
    * ``ladder="continued"``: the sines on the standard ladder, the cosines on its continuation
      ``temperature^(-(D + 2k) / D)`` (speechain's ``posenc_type="sep"``);

    laid out ``"interleaved"`` (``sin w0, cos w0, sin w1, ...``: sin at even channels, cos at
    odd; Vaswani et al.) or ``"split"`` (all sines, then all cosines: tensor2tensor).

    Peers: ``layout="split", ladder="t2t"`` is fairseq2's ``SinusoidalPositionEncoder`` (its table
    bit for bit, in float32 and float64); ``layout="split", ladder="continued"`` is speechain's
    ``posenc_type="sep"`` and the default is its ``"mix"`` (both to float32 rounding, see
    :class:`~vispos.SpeechainPositionalEncoding` for the drop-in with speechain's names).

    Positions are ``0 .. L-1`` by default. ``positions`` gives any others (offsets for
    incremental decoding, left padding, fractional positions). With ``key_padding_mask`` the
    positions count valid steps only (the first valid step is 0) unless ``positions`` is given,
    and padded steps get no encoding (``PE = 0``, so they hold ``norm(x) * s``). fairseq2 instead
    ignores its padding mask: every step ``i`` gets row ``start + i`` of the table, padded or
    not. To match it, pass ``positions=start + arange(L)`` and no ``key_padding_mask``.

    The default table of ``max_len`` rows is a non-persistent buffer; a longer input rebuilds it
    for the new length (no error, nothing in ``state_dict``). The input is never modified in
    place.

    Args:
        dim (int): embedding size ``D``, the width of ``x`` (positive, even; ``>= 4`` with
            ``ladder="t2t"``). Formerly ``d_model``: that keyword still works, with
            a ``DeprecationWarning``.
        dropout (float): dropout probability on the sum, in ``[0, 1)``. Default 0.
        max_len (int): rows of the table built at construction. Default 5000.
        layout (str): ``"interleaved"`` (default) or ``"split"``.
        batch_first (bool): input is ``(B, L, D)`` (default) rather than ``(L, B, D)``.
        emb_scale (bool): multiply the (normalised) input by ``sqrt(dim)`` (Vaswani et
            al., section 3.4).
        emb_layernorm (bool): LayerNorm the input first (speechain).
        learnable_scale (bool): multiply the encoding by a trained scalar ``alpha``
            (Transformer-TTS).
        init_alpha (float): initial ``alpha``; only with ``learnable_scale=True``. Default 1.
        ladder (str): ``"standard"`` (default), ``"t2t"`` or ``"continued"``.
        temperature (float): ``T`` of the ladder. Default 10000.

    Shape:
        - x: ``Tensor[B, L, D]`` (``batch_first=True``) or ``Tensor[L, B, D]``, any float dtype.
        - positions (optional): ``Tensor[B, L]`` or ``Tensor[L]``, any real dtype, on x's device.
          Always batch-first, whatever ``batch_first`` says (like ``key_padding_mask``).
        - key_padding_mask (optional): ``Tensor[B, L]``, bool, True marks padding.
        - output: same shape and dtype as ``x``. The encoding is computed in float32 (float64
          for a float64 ``x``); half and bfloat16 inputs are added to it in float32 and the sum
          cast back once.

    Raises:
        TypeError: a non-int ``dim`` / ``max_len``, a non-bool flag, a non-number
            ``dropout`` / ``init_alpha`` / ``temperature``, a non-str ``layout`` / ``ladder``; at
            ``forward``: a non-float ``x``, a non-bool mask (with a hint on how to convert),
            non-real positions.
        ValueError: odd or non-positive ``dim``; ``dropout`` outside ``[0, 1)``; non-positive
            ``max_len`` or ``temperature``; unknown ``layout`` / ``ladder``; ``init_alpha != 1``
            without ``learnable_scale``; at ``forward``: wrong shapes or devices.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017; tensor2tensor
        ``get_timing_signal_1d``; fairseq2 ``SinusoidalPositionEncoder``; speechain
        ``PositionalEncoding`` (the continued ladder, LayerNorm before the scale); Li et al.,
        Neural Speech Synthesis with Transformer Network, AAAI 2019 (``learnable_scale``).
    """

    @_deprecation.renamed_kwargs(d_model="dim")
    def __init__(
        self,
        dim: int,
        dropout: float = 0.0,
        max_len: int = 5000,
        layout: str = "interleaved",
        batch_first: bool = True,
        emb_scale: bool = False,
        emb_layernorm: bool = False,
        learnable_scale: bool = False,
        init_alpha: float = 1.0,
        ladder: str = "standard",
        temperature: float = 10000.0,
    ) -> None:
        super().__init__(
            dim, dropout=dropout, max_len=max_len, layout=layout, batch_first=batch_first,
            ladder=ladder, temperature=temperature,
        )
        emb_scale = check_bool(emb_scale, "emb_scale")
        emb_layernorm = check_bool(emb_layernorm, "emb_layernorm")
        learnable_scale = check_bool(learnable_scale, "learnable_scale")
        init_alpha = check_number(init_alpha, "init_alpha")
        if not learnable_scale and init_alpha != 1.0:
            raise ValueError(
                f"init_alpha={init_alpha} has no effect without learnable_scale=True; "
                "pass learnable_scale=True or leave init_alpha at 1.0"
            )
        self.emb_scale = emb_scale
        self.init_alpha = float(init_alpha)
        self.layernorm = nn.LayerNorm(self.dim) if emb_layernorm else None
        self.alpha = nn.Parameter(torch.tensor(float(init_alpha))) if learnable_scale else None

    def _shape_encoding(self, enc: Tensor) -> Tensor:
        return enc if self.alpha is None else self.alpha * enc

    def _prepare_input(self, x: Tensor) -> Tensor:
        return _norm_then_scale(x, self.layernorm, self.emb_scale, self.dim)

    def extra_repr(self) -> str:
        return (
            f"{self._common_repr()}, emb_scale={self.emb_scale}, "
            f"emb_layernorm={self.layernorm is not None}, learnable_scale={self.alpha is not None}, "
            f"init_alpha={self.init_alpha}, {self._ladder_repr()}"
        )


class LearnableSinusoidalPositionalEncoding(_DeprecatedDModel, _SequenceSinusoid):
    """Sinusoidal encoding passed through a trained position-wise feed-forward, then added.

    ``out = dropout(x + FFN(PE(p)))`` with ``FFN = Linear(D, H), Sigmoid, Dropout, Linear(H, D)``
    (the learnable sinusoidal positional encoding, LSPE) and ``PE`` as in
    :class:`SinusoidalPositionalEncoding` (same ``positions`` / ``key_padding_mask`` semantics:
    padded steps get no encoding, after the FFN). The FFN's layers are ``self.ffn[0]`` and
    ``self.ffn[3]``.

    Args:
        dim (int): embedding size ``D``, the width of ``x`` (positive, even). Formerly ``d_model``:
            that keyword still works, with a ``DeprecationWarning``.
        hidden_dim (int, optional): ``H``, the FFN's hidden size; ``dim`` when not given.
        dropout (float): dropout probability, used inside the FFN and on the sum. Default 0.
        max_len (int): rows of the sinusoid table built at construction; longer inputs extend it.
        layout (str): ``"interleaved"`` (default) or ``"split"``.
        batch_first (bool): input is ``(B, L, D)`` (default) rather than ``(L, B, D)``.
        ladder (str): ``"standard"`` (default), ``"t2t"`` or ``"continued"``.
        temperature (float): ``T`` of the ladder. Default 10000.

    Shape:
        - x: ``Tensor[B, L, D]`` (``batch_first=True``) or ``Tensor[L, B, D]``, any float dtype.
        - positions (optional): ``Tensor[B, L]`` or ``Tensor[L]``, any real dtype.
        - key_padding_mask (optional): ``Tensor[B, L]``, bool, True marks padding.
        - output: same shape and dtype as ``x``. The FFN runs in its parameters' dtype.

    Raises:
        TypeError, ValueError: as :class:`SinusoidalPositionalEncoding`, and a non-positive or
            non-int ``hidden_dim``.

    References:
        Wang et al., A Simple yet Effective Learnable Positional Encoding Method for Improving
        Document Transformer Model, Findings of AACL-IJCNLP 2022.
    """

    @_deprecation.renamed_kwargs(d_model="dim")
    def __init__(
        self,
        dim: int,
        hidden_dim: int | None = None,
        dropout: float = 0.0,
        max_len: int = 5000,
        layout: str = "interleaved",
        batch_first: bool = True,
        ladder: str = "standard",
        temperature: float = 10000.0,
    ) -> None:
        super().__init__(
            dim, dropout=dropout, max_len=max_len, layout=layout, batch_first=batch_first,
            ladder=ladder, temperature=temperature,
        )
        dim = self.dim  # checked (a Python int)
        hidden = dim if hidden_dim is None else check_int(hidden_dim, "hidden_dim", minimum=1)
        self.hidden_dim = hidden
        self.ffn = nn.Sequential(
            nn.Linear(dim, hidden), nn.Sigmoid(), nn.Dropout(dropout), nn.Linear(hidden, dim)
        )

    def _shape_encoding(self, enc: Tensor) -> Tensor:
        return self.ffn(enc.to(self.ffn[0].weight.dtype))

    def extra_repr(self) -> str:
        return f"{self._common_repr()}, hidden_dim={self.hidden_dim}, {self._ladder_repr()}"
