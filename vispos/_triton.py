"""Triton kernels behind torch custom ops: when the Triton path runs, how a kernel launches (on
CUDA, or through Triton's interpreter on the CPU for tests), and how many kernels each op launches.

vispos' hot masked reductions (the norms over valid cells, the sine embedding of a level) are
Triton kernels wrapped as torch custom ops (``torch.library.custom_op``) whose plain torch code is
their CPU path and their reference. This room is the one switch they all ask:

* :func:`use_triton` -- does a call on this tensor take the Triton path? On CUDA when Triton is
  installed; on the CPU only inside :func:`interpreted` (tests run every kernel there through
  Triton's interpreter, ``TRITON_INTERPRET=1``, against its torch reference).
* :func:`kernel` -- a decorator for a kernel's Python function: ``fn[grid](*args)`` launches it
  compiled (``triton.jit``) for CUDA tensors and interpreted for CPU tensors. Each launch is
  counted in a thread-local tally (:func:`launch_tally`) so a test can check an op's declared
  launches against the kernels it really starts.
* :func:`register_launches` / :func:`launches` -- every custom op declares how many kernels one
  call launches on a GPU. A launch count taken on the CPU (a ``TorchDispatchMode`` sees one custom
  op, whose CPU implementation runs many torch ops) weighs each custom op by that number.

References:
    Tillet et al., Triton, MAPL 2019; PyTorch ``torch.library.custom_op`` and the
    ``triton_op`` tutorial (custom ops with a fake implementation and a registered backward);
    Triton's interpreter mode (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["available", "use_triton", "interpreted", "kernel", "register_launches", "launches", "launch_tally"]

_LAUNCHES: dict[str, int] = {}
_LOCK = threading.Lock()
_STATE = threading.local()  # .forced (bool): CPU tensors take the Triton path; .tally (Counter or None)


_AVAILABLE = importlib.util.find_spec("triton") is not None  # a plain global: Dynamo reads it as a constant


def available() -> bool:
    """True when Triton can be imported (CUDA wheels of torch bring it; CPU wheels do not).

    Raises:
        Nothing.
    """
    return _AVAILABLE


def use_triton(t: torch.Tensor) -> bool:
    """Whether a custom op called on ``t`` runs its Triton kernels.

    Args:
        t (Tensor): the op's main input.

    Returns:
        bool: True on CUDA with Triton installed, and on the CPU inside :func:`interpreted`;
        False otherwise (the op's torch code runs).

    Raises:
        Nothing.
    """
    device = t.device.type
    if device == "cuda":
        return available()
    return device == "cpu" and getattr(_STATE, "forced", False) and available()


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """Inside it, CPU tensors take the Triton path through Triton's interpreter
    (``TRITON_INTERPRET=1`` is set for its duration): how the tests run every kernel without a GPU.
    Triton builds its own library functions (``tl.sum``, ``tl.cdiv``, ...) compiled or interpreted
    once, when it is first imported: a kernel that calls them runs interpreted only in a process
    that had ``TRITON_INTERPRET=1`` set before that (the tests' ``conftest.py`` sets it without CUDA).

    Raises:
        RuntimeError: Triton is not installed.
    """
    if not available():
        raise RuntimeError("vispos._triton.interpreted() needs Triton (pip install triton)")
    before, env = getattr(_STATE, "forced", False), os.environ.get("TRITON_INTERPRET")
    _STATE.forced = True
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        _STATE.forced = before
        if env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = env


class _Kernel:
    """A kernel's Python function, compiled for CUDA tensors and interpreted for CPU tensors on
    first use of each (see :func:`kernel`)."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self.__name__ = fn.__name__
        self._built: dict[bool, Any] = {}
        self._lock = threading.Lock()

    def _variant(self, interpret: bool) -> Any:
        built = self._built.get(interpret)
        if built is None:
            with self._lock:
                built = self._built.get(interpret)
                if built is None:
                    from triton.runtime.interpreter import InterpretedFunction
                    from triton.runtime.jit import JITFunction

                    # JITFunction, not triton.jit: triton.jit reads TRITON_INTERPRET, which another
                    # thread inside interpreted() may have set for the process
                    built = InterpretedFunction(self.fn) if interpret else JITFunction(self.fn)
                    self._built[interpret] = built
        return built

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            first = next(a for a in args if isinstance(a, torch.Tensor))
            tally = getattr(_STATE, "tally", None)
            if tally is not None:
                tally[self.__name__] += 1
            self._variant(first.device.type != "cuda")[grid](*args, **kwargs)

        return launch


def kernel(fn: Callable[..., None]) -> _Kernel:
    """Decorator: ``fn`` as a Triton kernel, launched with ``fn[grid](*args, **constexprs)``;
    compiled by ``triton.jit`` for CUDA tensors, run by Triton's interpreter for CPU tensors (the
    first tensor argument decides). Nothing is imported from Triton until the first launch.

    Args:
        fn (callable): a Triton kernel body (``tl.*`` calls, ``tl.constexpr`` parameters).

    Returns:
        a launcher object.

    Raises:
        Nothing at decoration; Triton's own errors at launch.
    """
    return _Kernel(fn)


@contextlib.contextmanager
def launch_tally() -> Iterator[Counter]:
    """Counts, by kernel name, the kernels launched by this thread inside it.

    Raises:
        Nothing.
    """
    before = getattr(_STATE, "tally", None)
    tally: Counter = Counter()
    _STATE.tally = tally
    try:
        yield tally
    finally:
        _STATE.tally = before


def register_launches(qualname: str, count: int) -> None:
    """Declares that one call of the custom op ``qualname`` (``"vispos::name"``) launches ``count``
    kernels on a GPU (each of its Triton kernels once).

    Raises:
        ValueError: ``count`` is not a positive int.
    """
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    with _LOCK:
        _LAUNCHES[qualname] = count


def launches(qualname: str) -> int | None:
    """Kernels one call of the custom op ``qualname`` launches on a GPU, or None when it declared
    none (not one of vispos' ops).

    Raises:
        Nothing.
    """
    return _LAUNCHES.get(qualname)
