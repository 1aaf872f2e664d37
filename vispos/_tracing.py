"""When host-side facts may be used: the one place that answers it for every encoder.

Two questions, asked once per call by whoever reads the input
(:func:`vispos.nested_tensor.parse_spatial_input`) and carried from there:

* :func:`host_facts` -- may this call use what is known on the host (per-item sizes, Python
  caches, host reads of a CPU mask, spatial sizes as Python ints)? Not while compiling,
  exporting or tracing (the graph must not bake the example's sizes in, nor specialise on
  them), and not while a CUDA graph is captured (a replay must not read staging buffers that
  were reused long ago).
* :func:`host_side` -- do tensors on this device live in host memory (CPU)? Reading them then
  costs no synchronisation, and per-item slicing beats one select. Every branch that reads
  tensor values on the host asks this one function (``tests/test_op_counts.py`` switches it
  off to prove that the device branch reads nothing back).

The N-D core asks one more, cheap question where it writes: :func:`compiling` -- TorchDynamo
refuses ``out=`` into strided views, so the core writes those with a copy instead.

References:
    PyTorch ``torch.compiler.is_compiling`` / ``is_exporting``, ``torch.jit.is_tracing``,
    ``torch._guards.detect_fake_mode``, ``torch.cuda.is_current_stream_capturing``.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["tracing", "compiling", "capturing", "host_side", "host_facts", "host_tensor", "host_arrays", "outside_graph"]


def _is_exporting() -> bool:
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting is not None and is_exporting())


try:  # pragma: no branch
    from torch._guards import TracingContext as _TracingContext
    from torch._guards import detect_fake_mode as _detect_fake_mode
except ImportError:  # pragma: no cover - very old torch
    _TracingContext = _detect_fake_mode = None
# the number of modes on the dispatch stack, infra modes (FakeTensorMode) included
_mode_count = getattr(torch._C, "_len_torch_dispatch_stack", None)


def _fake_mode() -> bool:
    """True while tensors are fake (non-strict ``torch.export``, ONNX's dynamo exporter and
    other ``make_fx`` tracers run the Python code on FakeTensors).

    ``detect_fake_mode`` finds a fake mode on the dispatch mode stack or in the tracing
    context; with both empty (two thread-local reads, well under a microsecond) its answer is
    None, so the call (about 5-10 us, most of a call's host-side decision) is skipped."""
    if _detect_fake_mode is None:  # pragma: no cover - very old torch
        return False
    if _mode_count is not None and _mode_count() == 0 and _TracingContext.try_get() is None:
        return False
    return _detect_fake_mode() is not None


def tracing() -> bool:
    """True under ``torch.compile``, ``torch.export`` (strict or not, hence ONNX's
    ``dynamo=True`` exporter), ``torch.jit`` tracing / scripting, or any fake-tensor tracer.

    Returns:
        bool: whether host-side shortcuts (caches, host reads, host sizes) must be skipped.

    Raises:
        Nothing: it only reads torch's tracing state.

    References:
        ``torch.compiler.is_compiling``, ``torch.jit.is_tracing``, ``detect_fake_mode``.
    """
    if torch.jit.is_scripting():
        return True
    return bool(
        torch.compiler.is_compiling() or _is_exporting() or torch.jit.is_tracing() or _fake_mode()
    )


def plain_eager(t: torch.Tensor) -> bool:
    """True in plain eager mode for ``t``: a plain tensor (no subclass), no ``torch.compile``, no
    ``TorchDispatchMode`` (fake tensors, ``make_fx``, ``torch.export``, op counters), no functorch
    transform and no ``torch.jit`` trace. A cheaper test than :func:`tracing` for the hot path:
    values kept across calls (a padding's facts) and direct calls of an op's implementation are
    used only there.

    Raises:
        Nothing.
    """
    # is_compiling first: TorchDynamo reads it as a constant and traces no further
    return (not torch.compiler.is_compiling() and type(t) is torch.Tensor and not torch._C._len_torch_dispatch_stack()
            and not torch._C._are_functorch_transforms_active() and not torch.jit.is_tracing())


def compiling() -> bool:
    """True while TorchDynamo traces (``torch.compile``, strict ``torch.export``): ``out=`` into
    a strided view is refused there, so the core writes such blocks with a copy instead.

    Returns:
        bool: ``torch.compiler.is_compiling()`` (a constant inside a compiled graph).

    Raises:
        Nothing.

    References:
        ``torch.compiler.is_compiling``.
    """
    return torch.compiler.is_compiling()


def capturing(device: torch.device) -> bool:
    """True while a CUDA graph is being captured on ``device``.

    Returns:
        bool: host values must then not be copied in (a replay would read the pinned staging
        buffer again, long after it was reused).

    Raises:
        Nothing.

    References:
        ``torch.cuda.is_current_stream_capturing``.
    """
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def host_side(device: torch.device) -> bool:
    """True where tensors live in host memory (CPU).

    Returns:
        bool: reading tensor values there (a mask check, sizes) costs no synchronisation.

    Raises:
        Nothing.

    References:
        CUDA semantics of host reads (``.item()``, ``.tolist()`` synchronise the stream).
    """
    return device.type == "cpu"


def host_facts(device: torch.device) -> bool:
    """The per-call decision: may host-side facts be used for an input on ``device``?

    Returns:
        bool: False while tracing (:func:`tracing`) or capturing a CUDA graph
        (:func:`capturing`), True otherwise.

    Raises:
        Nothing.

    References:
        See the module docstring.
    """
    return not tracing() and not capturing(device)


def host_tensor(values: list | np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small tensor from host values on ``device``, without a host synchronisation: the one
    way host facts (sizes, boxes) travel to a device.

    On CUDA the values go through pinned memory and a non-blocking copy (a blocking copy from
    pageable memory would synchronise the stream). Callers check :func:`host_facts` first: a
    CUDA graph replay must not read the staging buffer.

    Returns:
        Tensor: ``values`` in ``dtype`` on ``device``.

    Raises:
        Nothing beyond torch's own errors.

    References:
        PyTorch CUDA semantics ("Use pinned memory buffers").
    """
    if device.type == "cuda":
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype, device=device)


_ALIGN = 8  # bytes: every array of a packed transfer starts at a multiple of its itemsize
_TORCH_DTYPES = {np.dtype(k): v for k, v in (
    (np.float32, torch.float32), (np.float64, torch.float64), (np.int64, torch.int64),
    (np.int32, torch.int32), (np.bool_, torch.bool), (np.uint8, torch.uint8),
)}


def host_arrays(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """NumPy arrays built on the host as tensors on ``device``, in at most one transfer.

    On the CPU every array is shared as it is (``torch.from_numpy``: no copy, no op). Elsewhere
    the arrays are packed into one byte buffer that travels as :func:`host_tensor` sends it
    (pinned memory, one non-blocking copy) and is read back as views of their dtypes and
    shapes: several host tables cost one device op. Callers check :func:`host_facts` first.

    Args:
        arrays (list of np.ndarray): arrays of float32, float64, int64, int32, bool or uint8,
            owned by the caller and not written afterwards (on the CPU they are shared).
        device (torch.device): where the tensors are wanted.

    Returns:
        list of Tensor: one per array, same dtype, shape and values, on ``device``.

    Raises:
        Nothing beyond torch's own errors.

    References:
        PyTorch CUDA semantics ("Use pinned memory buffers"); ``Tensor.view(dtype)``.
    """
    if device.type == "cpu":
        return [torch.from_numpy(a) for a in arrays]
    return _packed(arrays, device)


def _packed(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """:func:`host_arrays` through one byte buffer (its form off the CPU)."""
    offsets, total = [], 0
    for a in arrays:
        total = -(-total // _ALIGN) * _ALIGN
        offsets.append(total)
        total += a.nbytes
    packed = np.zeros(total, dtype=np.uint8)
    for a, start in zip(arrays, offsets):
        packed[start : start + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    moved = host_tensor(packed, torch.uint8, device)
    return [
        moved[start : start + a.nbytes].view(_TORCH_DTYPES[a.dtype]).view(a.shape)
        for a, start in zip(arrays, offsets)
    ]


def outside_graph(fn):
    """Decorator: ``fn`` always runs eagerly, outside any graph ``torch.compile`` captures (the host
    work of a call: boxes, masks, checks), as ``torch.compiler.disable`` does, but TorchDynamo is
    imported on the first call, not when vispos is imported (``import vispos`` stays light).

    Args:
        fn (callable): the function.

    Returns:
        callable: the wrapped function.

    Raises:
        Nothing beyond ``fn``'s own errors.

    References:
        ``torch.compiler.disable``; ``torch._disable_dynamo`` (the same decorator, imported lazily).
    """
    lazy = getattr(torch, "_disable_dynamo", None)
    return lazy(fn) if lazy is not None else torch.compiler.disable(fn)
