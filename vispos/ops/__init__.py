"""vispos' fused ops: Triton kernels registered as torch custom ops, one module per op.

* :mod:`.batch_norm` -- ``vispos::valid_batch_norm`` (and its backward): batch norm with statistics
  over every item's valid cells, running statistics updated in its kernels;
* :mod:`.group_norm` -- ``vispos::valid_group_norm`` (and its backward): group and instance norm
  over each item's valid cells;
* :mod:`.sine` -- ``vispos::sine_boxes`` / ``vispos::sine_counts``: DETR's sine embedding of a
  padded level in one launch.

Each op module holds its launcher, its op registration, its fake and its autograd; its kernels sit
beside it (``_<op>_kernels.py``, imported on the first launch so that ``import vispos`` never
imports Triton), its torch code (the CPU path and the kernels' reference) in
:mod:`._norm_reference` for the norms and in :mod:`.sine` for the embedding. Shared pieces:
:mod:`._triton` (when the Triton path runs, launches under the device guard, launch and variant
counts), :mod:`._jit` (the ``@triton.jit`` helpers every kernel calls), :mod:`._sizes` (tiles, warps,
chunks and strides from the sizes), :mod:`._norm_boundary` (the norm ops' argument checks).

This package sits between :mod:`vispos.nested_tensor` and :mod:`vispos.invariance`: it imports
neither :mod:`vispos.invariance` nor :mod:`vispos.encodings`.

References:
    Liger-Kernel's ``ops/`` (one file per op, shared ``@triton.jit`` helpers, ``calculate_settings``);
    PyTorch's custom-op and ``triton_op`` guides.
"""

from . import _inductor  # noqa: F401  the ops seen through by inductor (imports no Triton)

__all__: list[str] = []  # the ops are imported from their modules (vispos.ops.batch_norm.batch_norm, ...)
