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

import torch

__all__ = ["tracing", "compiling", "capturing", "host_side", "host_facts", "host_tensor"]


def _is_exporting() -> bool:
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting is not None and is_exporting())


def _fake_mode() -> bool:
    """True while tensors are fake (non-strict ``torch.export``, ONNX's dynamo exporter and
    other ``make_fx`` tracers run the Python code on FakeTensors)."""
    try:
        from torch._guards import detect_fake_mode
    except ImportError:  # pragma: no cover - very old torch
        return False
    return detect_fake_mode() is not None


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


def host_tensor(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
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
