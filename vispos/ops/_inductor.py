"""The fused ops seen through by ``torch.compile``: under AOTAutograd's functionalization each op on
the Triton path decomposes into its kernels' launches, so inductor launches vispos' kernels itself.

Without this room each op (``vispos::valid_batch_norm``, ``vispos::valid_group_norm``, their
backwards, ``vispos::sine_boxes`` and ``vispos::sine_counts``) is one opaque node for inductor, which
calls the op's Python, which launches the kernels. Here every op gets a ``FunctionalTensorMode``
rule (``torch.library.register_torch_dispatch``): the mechanism ``torch.library.triton_op`` uses for
its own ops (``functional_decomp`` in ``torch/_library/triton.py``), on vispos' plain
``torch.library.Library`` ops, which keep their direct dispatch in eager mode (``triton_op``'s
``custom_op`` adds Python autograd and in-place layers, about 10 us a call, and
``register_autograd`` refuses ops that mutate, as the batch norm's running statistics are). The
rule runs the op's Triton launcher with every launch through ``torch.library.wrap_triton``
(:func:`vispos.ops._triton.wrapped`): AOTAutograd records one ``triton_kernel_wrapper_functional``
node per launch, the tensors a kernel writes found by Triton's mutation analysis of its TTIR (the
running statistics become input mutations, copied back after the graph), and inductor lowers each
node to its own launch of the kernel, planning the buffers around it.

The rule decomposes only where the op runs its kernels: CUDA tensors with Triton installed, a
non-empty map (and, for the backwards, a forward that ran its kernels: ``x`` given). Elsewhere
(the CPU's torch path, an empty map), under ``torch.export`` (``decompose_custom_triton_ops``
switched off: an exported program keeps the op, whose Triton source is no part of a serialised
graph, as ``triton_op``'s ops are kept) and for tensor subclasses the mode does not know, the op
stays one node (the mode's own handling, ``auto_functionalized`` for the ops that write). The
launchers are the ops' own (:mod:`._batch_norm_kernels`, :mod:`._group_norm_kernels`,
:func:`.sine._sine_boxes`), so a traced launch takes the arguments an eager one takes; only the
norms' ``eps`` / ``momentum`` tensor is built in the graph (:func:`_scalars`). :data:`DECOMPOSITIONS`
holds each op's Triton path as a function of the op's arguments, callable eagerly (the tests
compare its numbers with the op's under Triton's interpreter).

Where Triton's mutation analysis cannot run (no GPU target: ``triton.runtime.driver`` finds no
driver; or Triton imported in interpreter mode, ``TRITON_INTERPRET=1``), torch logs a warning and
treats every tensor argument of a launch as written: a forward-only graph stays correct (with
copies), a training graph cannot be split (the backward's launches would "write" the weights).
On a GPU machine the analysis runs.

Nothing here imports Triton or the op modules: :func:`register` registers the rules by name (once,
at import), and the first traced call that decomposes imports the kernels.

References:
    PyTorch ``torch.library.triton_op`` and ``torch.library.wrap_triton`` (the user-defined Triton
    kernels tutorial), ``torch.library.register_torch_dispatch``; Tillet et al., Triton, MAPL 2019.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from . import _triton

__all__ = ["register", "decomposes", "decompose_cpu", "DECOMPOSITIONS"]

_LIB = torch.library.Library("vispos", "FRAGMENT")  # holds the rules' registrations
_LOCK = threading.Lock()
_REGISTERED = False
_CPU = threading.local()  # .on (bool): interpreted CPU calls decompose too (tests: decompose_cpu)


# ----------------------------------------------------------------- each op's Triton path
def _scalars(x: Tensor, eps: float, momentum: float | None) -> Tensor:
    """``Tensor[2]``: ``eps`` and ``momentum`` (0 for None) in the statistics' dtype of ``x``, as the
    norms' kernels read them, built on ``x``'s device inside the graph (two fills, one small fused
    kernel). Not :func:`._norm_boundary.scalars`' cached tensor, which a trace must not fill with a
    fake tensor, nor ``torch.tensor``, which a graph holds as a host constant copied to the device
    at every call (no CUDA graph can hold that copy)."""
    from ._norm_reference import stat_dtype

    dtype = stat_dtype(x.dtype)
    return torch.cat([x.new_full((1,), eps, dtype=dtype),
                      x.new_full((1,), 0.0 if momentum is None else momentum, dtype=dtype)])


def _batch_norm(x, weight, bias, mask, n, eps, zero_padding, momentum, running_mean, running_var,
                num_batches_tracked):
    """``vispos::valid_batch_norm``'s Triton path: ``(y, mean, invstd, xc)``, ``xc`` empty; the running
    statistics (when both are given) written by the second kernel."""
    from ._batch_norm_kernels import batch_norm_forward

    y, mean, invstd = batch_norm_forward(x, weight, bias, mask, _scalars(x, eps, momentum), momentum, running_mean,
                                         running_var, num_batches_tracked, zero_padding)
    return y, mean, invstd, mean.new_empty(0)


def _batch_norm_backward(dy, x, xc, mask, weight, mean, invstd, n, zero_padding, need_x, need_weight, need_bias):
    """``vispos::valid_batch_norm_backward``'s Triton path: ``(grad_x, grad_weight, grad_bias)``, an
    empty tensor for each one not asked for."""
    from ._batch_norm_kernels import batch_norm_backward
    from ._norm_boundary import triton_backward

    return triton_backward(batch_norm_backward, dy, x, mask, weight, need_x, need_weight, need_bias, mean, invstd,
                           zero_padding)


def _group_norm(x, weight, bias, mask, num_groups, eps):
    """``vispos::valid_group_norm``'s Triton path: ``(y, mean, rstd, centred)``, ``centred`` empty."""
    from ._group_norm_kernels import group_norm_forward
    from ._sizes import out_like

    y = out_like(x)
    mean, rstd = group_norm_forward(y, x, weight, bias, mask, num_groups, _scalars(x, eps, None))
    return y, mean, rstd, mean.new_empty(0)


def _group_norm_backward(dy, x, centred, mask, weight, mean, rstd, num_groups, need_x, need_weight, need_bias):
    """``vispos::valid_group_norm_backward``'s Triton path: ``(grad_x, grad_weight, grad_bias)``."""
    from ._group_norm_kernels import group_norm_backward
    from ._norm_boundary import triton_backward

    return triton_backward(group_norm_backward, dy, x, mask, weight, need_x, need_weight, need_bias, mean, rstd,
                           num_groups)


def _sine_boxes(*args: Any) -> None:
    """``vispos::sine_boxes``'s implementation (its Triton path where the op takes it)."""
    from .sine import _sine_boxes as impl

    impl(*args)


def _sine_counts(*args: Any) -> None:
    """``vispos::sine_counts``'s implementation (its Triton path where the op takes it)."""
    from .sine import _sine_counts as impl

    impl(*args)


def _forward_ran_kernels(args: tuple) -> bool:
    """A norm's backward runs its kernels after a forward that ran them (``x`` given)."""
    return args[1] is not None


#: op name (namespace ``vispos``) -> (its Triton path as a function of the op's arguments, the
#: argument that decides the path, an extra condition on the arguments or None)
DECOMPOSITIONS: dict[str, tuple[Callable[..., Any], int, Callable[[tuple], bool] | None]] = {
    "valid_batch_norm": (_batch_norm, 0, None),
    "valid_batch_norm_backward": (_batch_norm_backward, 0, _forward_ran_kernels),
    "valid_group_norm": (_group_norm, 0, None),
    "valid_group_norm_backward": (_group_norm_backward, 0, _forward_ran_kernels),
    "sine_boxes": (_sine_boxes, 0, None),
    "sine_counts": (_sine_counts, 0, None),
}


# ------------------------------------------------------------------------------ the rules
def decomposes(name: str, args: tuple) -> bool:
    """Whether a call of ``vispos::<name>`` on ``args`` (the op's arguments, in schema order)
    decomposes into its kernels' launches: a CUDA tensor with Triton installed (or a CPU one inside
    :func:`decompose_cpu` and :func:`vispos.ops._triton.interpreted`), a non-empty map, and for the
    backwards a forward that ran its kernels.

    Raises:
        KeyError: ``name`` is not one of :data:`DECOMPOSITIONS`.
    """
    _, main, extra = DECOMPOSITIONS[name]
    t = args[main]
    if not isinstance(t, Tensor) or not (t.is_cuda or getattr(_CPU, "on", False)):
        return False
    if not _triton.use_triton(t) or t.numel() == 0:
        return False
    return extra is None or extra(args)


def _rule(name: str) -> Callable[..., Any]:
    """The ``FunctionalTensorMode`` rule of ``vispos::<name>`` (see the module docstring)."""
    launcher = DECOMPOSITIONS[name][0]

    def functional_decomp(mode, op, types, args, kwargs):
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor
        from torch.export._trace import custom_triton_ops_decomposition_disabled

        if custom_triton_ops_decomposition_disabled():  # torch.export: the op stays
            return mode.__torch_dispatch__(op, types, args, kwargs)
        if not all(issubclass(t, FakeTensor) or t in (Tensor, FunctionalTensor) for t in types):
            return NotImplemented  # another subclass decides first (as triton_op's rule does)
        every = (*args, *(kwargs[a.name] for a in op._schema.arguments[len(args):] if a.name in kwargs))
        if not decomposes(name, every):
            return mode.__torch_dispatch__(op, types, args, kwargs)
        with mode, _triton.wrapped():
            return launcher(*every)

    functional_decomp.__qualname__ = functional_decomp.__name__ = f"functional_decomp_{name}"
    return functional_decomp


def register() -> None:
    """Registers every op's ``FunctionalTensorMode`` rule by name, once (later calls do nothing);
    imports neither Triton nor the op modules (a rule may be registered before its op is defined).
    Without Triton nothing is registered: no op runs kernels.

    Raises:
        Nothing.
    """
    global _REGISTERED
    if _REGISTERED or not _triton.available():
        return
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    with _LOCK:
        if _REGISTERED:
            return
        for name in DECOMPOSITIONS:
            torch.library.register_torch_dispatch(f"vispos::{name}", FunctionalTensorMode, _rule(name), lib=_LIB)
        _REGISTERED = True


@contextlib.contextmanager
def decompose_cpu() -> Iterator[None]:
    """Tests only: inside it (and :func:`vispos.ops._triton.interpreted`, where CPU calls take the
    Triton path) CPU calls decompose too, so a trace on CPU tensors holds the kernels' launches
    and runs them through Triton's interpreter.

    Raises:
        Nothing.
    """
    with _triton.thread_flag(_CPU, "on"):
        yield


register()
