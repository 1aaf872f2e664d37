"""Are we being compiled, exported or traced? One question every host-side shortcut asks.

Encoders skip their Python-side caches and every host read (``.item()``, ``.tolist()``, Python
ints from tensors) while :func:`tracing` is True, so that traced graphs stay dynamic in the
spatial sizes and hold no constants baked from the example input.

References:
    PyTorch ``torch.compiler.is_compiling`` / ``is_exporting``, ``torch.jit.is_tracing``,
    ``torch._guards.detect_fake_mode``.
"""

from __future__ import annotations

import torch

__all__ = ["tracing"]


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
        bool: whether host-side shortcuts (caches, host reads) must be skipped.
    """
    if torch.jit.is_scripting():
        return True
    return bool(
        torch.compiler.is_compiling() or _is_exporting() or torch.jit.is_tracing() or _fake_mode()
    )
