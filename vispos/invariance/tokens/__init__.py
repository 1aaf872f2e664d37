"""Whole token models on padded batches: timm's ViT / EVA, SAM's windowed ViT, Swin, packed runs.

Each family is one :class:`~vispos.invariance.tokens._tokens.TokenModelRule` registered in the
rule book, run padded (:class:`TokenRunner`) or packed (every item's tokens in one sequence,
:mod:`._packed`), with the per-item helpers in :mod:`._tokens` and :mod:`._token_batch`.
"""
