"""speechain's ``PositionalEncoding`` as a drop-in: its signature, attributes and checkpoints.

A thin class over the 1D sequence encoder (:mod:`vispos.encodings.sequence`) and the N-D core:
``posenc_type="mix"`` is the interleaved layout on the standard ladder, ``"sep"`` the split
layout on the *continued* ladder (cosines on the rungs after the sines'), exactly as speechain
computes them, to float32 rounding.

References:
    speechain ``speechain/module/transformer/pos_enc.py`` (``PositionalEncoding``, by Sashi
    Novitasari and Heli Qi); Vaswani et al., Attention Is All You Need, NeurIPS 2017; Li et al.,
    Neural Speech Synthesis with Transformer Network, AAAI 2019 (the learnable ``alpha``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import check_bool, check_choice, check_int, check_number
from .sequence import _SequenceSinusoid, _norm_then_scale

__all__ = ["SpeechainPositionalEncoding"]

_POSENC_TYPES = ("mix", "sep")


class SpeechainPositionalEncoding(_SequenceSinusoid):
    """speechain's ``PositionalEncoding``: same arguments, attributes, order of operations and
    checkpoints, on vispos' sinusoid core.

    ``out = dropout(LayerNorm(emb_feat) * sqrt(d_model) + alpha * PE)``, each of LayerNorm
    (``emb_layernorm``), the scale (``emb_scale``) and ``alpha`` (``posenc_scale``) optional,
    in that order (speechain's forward: LayerNorm, then scale, then add ``alpha`` times the
    encoding, then dropout). ``PE(pos)`` for position ``pos = 0 .. L-1`` and
    ``d = d_model``:

    * ``posenc_type="mix"``: ``PE[pos, 2i] = sin(pos / 10000^(2i/d))`` and
      ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d))``, ``i = 0 .. d/2 - 1`` (Vaswani et al.);
    * ``posenc_type="sep"``: ``PE[pos, i] = sin(pos / 10000^(2i/d))`` for ``i < d/2`` and
      ``PE[pos, d/2 + i] = cos(pos / 10000^((d + 2i)/d))``: the cosines run on the ladder's
      continuation (speechain's ``div_term_ext``), not on the sines' frequencies as in
      tensor2tensor's split layout. speechain's docstring cites Dong et al.
      (Speech-Transformer, ICASSP 2018) for this type; the formula above is its code's.

    The same as ``SinusoidalPositionalEncoding(d_model, layout=..., ladder=..., emb_scale=...,
    emb_layernorm=..., learnable_scale=posenc_scale)`` with speechain's names.

    Attributes as in speechain: ``posenc_type``, ``d_model``, ``emb_scale`` (bool),
    ``emb_layernorm`` (the ``nn.LayerNorm``, present only when enabled), ``alpha`` (the
    ``nn.Parameter``, present only with ``posenc_scale``), ``init_alpha`` (float), ``posenc``
    (``Tensor[1, max_len, d_model]``, float32) and ``dropout`` (the ``nn.Dropout``); methods
    ``reset_parameters``, ``update_posenc`` and ``get_recordable_para``.

    Where vispos differs from speechain (on purpose):

    * inputs longer than the table grow it (speechain's own growth call raises a
      ``TypeError``: ``update_posenc`` is called with one argument too many);
    * the caller's tensor is never written: speechain scales ``emb_feat`` in place
      (``emb_feat *= sqrt(d_model)``) when ``emb_scale`` is on without ``emb_layernorm``;
    * ``posenc`` is derived, so it is a non-persistent buffer (not in ``state_dict``); a
      speechain checkpoint, which holds it, loads with ``strict=True`` (the saved table is
      dropped after its width is checked);
    * the encoding is computed in float32 (float64 for a float64 ``emb_feat``, where speechain
      casts its float32 table) and half / bfloat16 inputs come back in their own dtype, added in
      float32 and rounded once (speechain returns float32 for them);
    * bad arguments raise ``TypeError`` / ``ValueError`` naming the parameter, not an
      ``AssertionError``.

    Args:
        posenc_type (str): ``"mix"`` (default) or ``"sep"``, see above.
        d_model (int): embedding size (positive, even). Default 512.
        emb_scale (bool): multiply the (normalised) input by ``sqrt(d_model)``. Default False.
        emb_layernorm (bool): LayerNorm the input first. Default False.
        posenc_scale (bool): multiply the encoding by a trained scalar ``alpha``. Default False.
        init_alpha (float): ``alpha``'s initial value (stored, unused without ``posenc_scale``,
            as in speechain). Default 1.0.
        max_len (int): rows of the table built at construction. Default 5000.
        dropout (float): dropout probability on the sum, in ``[0, 1)``. Default 0.

    Shape:
        - emb_feat: ``Tensor[B, L, d_model]`` (batch first, as speechain), any float dtype.
        - output: same shape and dtype as ``emb_feat``.

    Raises:
        TypeError: a non-str ``posenc_type``, a non-int ``d_model`` / ``max_len``, a non-bool
            flag, a non-number ``init_alpha`` / ``dropout``; at ``forward``: a non-tensor or
            non-float ``emb_feat``.
        ValueError: ``posenc_type`` not ``"mix"`` / ``"sep"``; odd or non-positive ``d_model``;
            non-finite ``init_alpha``; non-positive ``max_len``; ``dropout`` outside ``[0, 1)``;
            at ``forward``: ``emb_feat`` not of shape ``(B, L, d_model)``.

    References:
        speechain ``PositionalEncoding`` (``speechain/module/transformer/pos_enc.py``);
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sections 3.4 and 3.5);
        Li et al., Neural Speech Synthesis with Transformer Network, AAAI 2019 (``alpha``).
    """

    _width_name = "d_model"  # speechain's name (a drop-in keeps its peer's names)

    def __init__(
        self,
        posenc_type: str = "mix",
        d_model: int = 512,
        emb_scale: bool = False,
        emb_layernorm: bool = False,
        posenc_scale: bool = False,
        init_alpha: float = 1.0,
        max_len: int = 5000,
        dropout: float = 0.0,
    ) -> None:
        posenc_type = check_choice(posenc_type, _POSENC_TYPES, "posenc_type")
        emb_scale = check_bool(emb_scale, "emb_scale")
        emb_layernorm = check_bool(emb_layernorm, "emb_layernorm")
        posenc_scale = check_bool(posenc_scale, "posenc_scale")
        init_alpha = check_number(init_alpha, "init_alpha")
        mix = posenc_type == "mix"
        super().__init__(
            d_model, dropout=dropout, max_len=max_len, layout="interleaved" if mix else "split",
            batch_first=True, ladder="standard" if mix else "continued", temperature=10000.0,
        )
        self.posenc_type = posenc_type
        self.emb_scale = emb_scale
        self.posenc_scale = posenc_scale
        self.init_alpha = float(init_alpha)
        # present only when enabled, as in speechain (whose code and users test ``hasattr``)
        if emb_layernorm:
            self.emb_layernorm = nn.LayerNorm(self.dim)
        if posenc_scale:
            self.alpha = nn.Parameter(torch.tensor(self.init_alpha))

    @property
    def d_model(self) -> int:
        """int: the embedding size ``D`` (speechain's attribute)."""
        return self.dim

    @property
    def posenc(self) -> Tensor:
        """``Tensor[1, max_len, d_model]`` float32: the cached table, as speechain's buffer."""
        return self.pe.unsqueeze(0)

    def forward(self, emb_feat: Tensor) -> Tensor:
        """Adds the encoding to ``emb_feat`` (not modified); see the class docstring.

        Args:
            emb_feat (Tensor[B, L, d_model]): embedded feature sequences, any float dtype.

        Returns:
            Tensor[B, L, d_model]: in ``emb_feat``'s dtype.

        Raises:
            TypeError, ValueError: ``emb_feat`` is not a float tensor of shape ``(B, L, d_model)``.
        """
        return self._add_encoding(emb_feat, None, None, "emb_feat")

    def _prepare_input(self, x: Tensor) -> Tensor:
        return _norm_then_scale(x, self._modules.get("emb_layernorm"), self.emb_scale, self.d_model)

    def _shape_encoding(self, enc: Tensor) -> Tensor:
        return self.alpha * enc if self.posenc_scale else enc

    def reset_parameters(self) -> None:
        """Sets ``alpha`` back to ``init_alpha`` (speechain's reset; nothing else is touched).

        Unlike speechain's (which assigns a new CPU float32 tensor to ``alpha.data``), ``alpha``
        keeps its device and dtype.
        """
        if self.posenc_scale:
            with torch.no_grad():
                self.alpha.fill_(self.init_alpha)

    def update_posenc(self, max_len: int) -> None:
        """Rebuilds ``posenc`` with ``max_len`` rows (longer inputs still grow it).

        Args:
            max_len (int): rows of the new table, >= 1.

        Raises:
            TypeError: ``max_len`` is not an int. ValueError: it is < 1.
        """
        self._rebuild_table(check_int(max_len, "max_len", minimum=1))

    def get_recordable_para(self) -> dict[str, Tensor] | None:
        """``{"alpha": alpha}`` with ``posenc_scale``, else None (what speechain's trainer logs)."""
        return {"alpha": self.alpha} if self.posenc_scale else None

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):  # type: ignore[no-untyped-def]
        # speechain saves the derived table ``posenc`` with its weights; it is rebuilt here, so a
        # speechain checkpoint is accepted (after a check that its width is d_model) and dropped.
        saved = state_dict.pop(prefix + "posenc", None)
        if saved is not None and (
            not isinstance(saved, Tensor) or saved.dim() != 3 or saved.shape[-1] != self.d_model
        ):
            shape = tuple(saved.shape) if isinstance(saved, Tensor) else type(saved).__name__
            error_msgs.append(
                f"size mismatch for {prefix}posenc: a speechain table of shape (1, max_len, "
                f"{self.d_model}) was expected, the checkpoint holds {shape}"
            )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        return (
            f"posenc_type={self.posenc_type!r}, d_model={self.d_model}, emb_scale={self.emb_scale}, "
            f"emb_layernorm={'emb_layernorm' in self._modules}, posenc_scale={self.posenc_scale}, "
            f"init_alpha={self.init_alpha}, max_len={self.max_len}, dropout={self.dropout.p}"
        )
