"""Triton kernels behind torch custom ops: when the Triton path runs, how a kernel launches (on
CUDA, or through Triton's interpreter on the CPU for tests), how many kernels each op launches, and
how many compiled variants a kernel asks for.

vispos' hot masked reductions (the norms over valid cells, the sine embedding of a level) are
Triton kernels wrapped as torch custom ops whose plain torch code is their CPU path and their
reference. This room is the one switch they all ask:

* :func:`use_triton` -- does a call on this tensor take the Triton path? On CUDA when Triton is
  installed; on the CPU only inside :func:`interpreted` (tests run every kernel there through
  Triton's interpreter, ``TRITON_INTERPRET=1``, against its torch reference).
* :func:`kernel` -- a decorator for a kernel's Python function: ``fn[grid](*args)`` launches it
  compiled (``triton.jit``, with ``do_not_specialize`` for its sizes and strides) for CUDA tensors
  and interpreted for CPU tensors, under the tensor's device guard. Each launch is counted in a
  thread-local tally (:func:`launch_tally`) so a test can check an op's declared launches against
  the kernels it really starts.
* :func:`device_function` -- a decorator for a ``@triton.jit`` helper shared by several kernels
  (compiled inline into each; called directly by the interpreter).
* :func:`variant_key` -- the key under which Triton's own binder caches a compiled variant of a
  kernel for given arguments: how tests and benchmarks count variants without a GPU.
* :func:`eager_call` -- an op called as its own implementation in plain eager mode (the dispatcher's
  boxing of a Python op's arguments costs about 15 us a call), as the op wherever anything watches.
* :func:`register_launches` / :func:`launches` -- every custom op declares how many kernels one
  call launches on a GPU. A launch count taken on the CPU (a ``TorchDispatchMode`` sees one custom
  op, whose CPU implementation runs many torch ops) weighs each custom op by that number.

References:
    Tillet et al., Triton, MAPL 2019; PyTorch ``torch.library.custom_op`` and the
    ``triton_op`` tutorial (custom ops with a fake implementation and a registered backward);
    Triton's interpreter mode (``TRITON_INTERPRET=1``) and ``do_not_specialize``.
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

from .. import _tracing

__all__ = ["available", "use_triton", "interpreted", "kernel", "device_function", "variant_key", "register_launches",
           "launches", "launch_tally", "eager_call", "plain_eager", "wrapped", "thread_flag"]

_LAUNCHES: dict[str, int] = {}
_LOCK = threading.Lock()
_STATE = threading.local()  # .forced (bool): CPU tensors take the Triton path; .tally (Counter or None);
# .wrapped (bool): launches go through torch.library.wrap_triton (see wrapped)


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
    if t.is_cuda:
        return _AVAILABLE
    return _AVAILABLE and getattr(_STATE, "forced", False) and t.device.type == "cpu"


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
        raise RuntimeError("vispos.ops._triton.interpreted() needs Triton (pip install triton)")
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

    def __init__(self, fn: Callable[..., None], do_not_specialize: tuple[str, ...]) -> None:
        self.fn = fn
        self.__name__ = fn.__name__
        self.do_not_specialize = do_not_specialize
        self._built: dict[bool, Any] = {}
        self._binder: Any = None  # Triton's argument binder, built by variant_key
        self._lock = threading.Lock()

    def variant(self, interpret: bool) -> Any:
        """The ``triton.jit`` function (``interpret=False``) or its interpreted twin."""
        built = self._built.get(interpret)
        if built is None:
            with self._lock:
                built = self._built.get(interpret)
                if built is None:
                    from triton.runtime.interpreter import InterpretedFunction
                    from triton.runtime.jit import JITFunction

                    # JITFunction, not triton.jit: triton.jit reads TRITON_INTERPRET, which another
                    # thread inside interpreted() may have set for the process
                    cls = InterpretedFunction if interpret else JITFunction
                    built = cls(self.fn, do_not_specialize=self.do_not_specialize)
                    self._built[interpret] = built
        return built

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        if getattr(_STATE, "wrapped", False):  # a launch a trace records (see wrapped)
            from torch.library import wrap_triton

            return wrap_triton(self.variant(False))[grid]

        def launch(*args: Any, **kwargs: Any) -> None:
            first = next(a for a in args if isinstance(a, torch.Tensor))
            tally = getattr(_STATE, "tally", None)
            if tally is not None:
                tally[self.__name__] += 1
            device = first.device
            if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
                with torch.cuda.device(device):  # Triton launches on the current device
                    self.variant(False)[grid](*args, **kwargs)
                return
            self.variant(device.type != "cuda")[grid](*args, **kwargs)

        return launch


@contextlib.contextmanager
def wrapped() -> Iterator[None]:
    """Inside it, every kernel launch of this thread is ``torch.library.wrap_triton(jit)[grid](...)``,
    ``jit`` the kernel's ``triton.jit`` function (whatever the tensors' device): a
    ``triton_kernel_wrapper_mutation`` call that a trace (``make_fx``, AOTAutograd's
    functionalization) records as a node and inductor lowers to its own launch. How
    :mod:`._inductor` decomposes the ops; such launches are not counted by :func:`launch_tally`.

    Raises:
        Nothing here; Triton's import error at the first launch without Triton.
    """
    with thread_flag(_STATE, "wrapped"):
        yield


@contextlib.contextmanager
def thread_flag(state: threading.local, name: str) -> Iterator[None]:
    """Sets ``state.<name>`` to True for this thread inside it, then back to what it was (False
    when unset): the switches of this package (:func:`wrapped`, ``_inductor.decompose_cpu``).

    Raises:
        Nothing.
    """
    before = getattr(state, name, False)
    setattr(state, name, True)
    try:
        yield
    finally:
        setattr(state, name, before)


def kernel(*, do_not_specialize: tuple[str, ...] = ()) -> Callable[[Callable[..., None]], _Kernel]:
    """Decorator: ``fn`` as a Triton kernel, launched with ``fn[grid](*args, **constexprs)``;
    compiled by ``triton.jit`` for CUDA tensors, run by Triton's interpreter for CPU tensors (the
    first tensor argument decides), under that tensor's device guard. Nothing is imported from
    Triton until the first launch.

    Args:
        do_not_specialize (tuple of str): parameters Triton must not specialize on (sizes and
            strides: a value of 1 or a multiple of 16 would otherwise compile a new variant).

    Returns:
        a decorator giving a launcher object.

    Raises:
        Nothing at decoration; Triton's own errors at launch.
    """
    return lambda fn: _Kernel(fn, tuple(do_not_specialize))


def device_function(fn: Callable[..., Any]) -> Any:
    """Decorator: ``fn`` as a ``@triton.jit`` helper that kernels call (compiled inline into each
    kernel); under Triton's interpreter the call runs ``fn``'s Python body, whichever mode Triton
    was imported in. Imports Triton: only modules of kernels use it.

    Raises:
        Nothing.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    class _Helper(JITFunction):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:  # only the interpreter calls it
            return self._interpreted(*args, **kwargs)

    helper = _Helper(fn)
    helper._interpreted = InterpretedFunction(fn)
    return helper


def variant_key(kern: _Kernel, *args: Any, **kwargs: Any) -> str:
    """The key under which Triton caches a compiled variant of ``kern`` launched with ``args`` and
    ``kwargs`` (its binder's specialization of every argument, and the options): two launches
    with the same key share one compiled kernel. Runs without a GPU (meta tensors work).

    Raises:
        Triton's own errors for arguments a launch would refuse.
    """
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    jit = kern.variant(False)
    binder = kern._binder
    if binder is None:
        binder = kern._binder = create_function_from_signature(jit.signature, jit.params, BaseBackend)
    _, specialization, options = binder(*args, **kwargs)
    return str(specialization) + str(sorted(options.items()))


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


def eager_call(op: Any, impl: Callable[..., Any], x: torch.Tensor, *args: Any) -> Any:
    """``op(*args)``, or ``impl(*args)`` (the op's own implementation, the same code) in plain eager
    mode: a plain tensor ``x``, no ``TorchDispatchMode`` (fake tensors, ``make_fx``,
    ``torch.export``, the tests' op counters), no functorch transform, no ``torch.compile`` and no
    ``torch.jit`` trace. The dispatcher's boxing of a Python op's arguments costs about 15 us a
    call on the CPU, half of a masked norm's host time; anything that watches ops still sees the op.

    Raises:
        What ``op`` or ``impl`` raises.
    """
    return impl(*args) if plain_eager(x) else op(*args)


plain_eager = _tracing.plain_eager  # whether an op may run as its own implementation
