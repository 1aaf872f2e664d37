"""How the benchmarks measure one call: time (steady state), dispatched ops, peak memory.

* :func:`time_sample`: mean ms of ``k`` back-to-back calls (CUDA events on CUDA).
* :func:`count_ops`: the aten compute ops one call dispatches (views and metadata-only ops
  excluded), a device-independent proxy for GPU kernel launches; :func:`count_device_ops` the
  same with vispos' host-side shortcuts switched off (the device branch, as on CUDA).
* :func:`peak_bytes`: the peak extra memory of one call, outputs included (CPU: the resident
  high-water mark, in a process where :func:`malloc_setup` made glibc return freed blocks).
"""

from __future__ import annotations

import collections
import ctypes
import gc
import importlib
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["count_device_ops", "count_ops", "malloc_setup", "peak_bytes", "time_sample"]


def malloc_setup() -> None:
    """Large blocks via mmap (returned to the OS on free), so RSS tracks live memory.

    Only for the peak-memory pass: every such allocation then page-faults, which is not how a
    loop runs (and would make the page faults most of the measured time)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (fixed, disables the dynamic threshold)
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    except OSError:  # pragma: no cover - not glibc
        pass


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field_name):
                return int(line.split()[1])
    return 0


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak extra memory of one call, outputs included."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    base = _rss_kib("VmRSS")
    out = fn()
    peak = _rss_kib("VmHWM") - base
    del out
    return peak * 1024


def time_sample(fn: Callable[[], object], device: torch.device, k: int = 1) -> float:
    """Mean ms of ``k`` back-to-back calls, each result dropped before the next (steady state)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            out = fn()
            del out
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / k
    t0 = time.perf_counter()
    for _ in range(k):
        out = fn()
        del out
    return (time.perf_counter() - t0) * 1e3 / k


# metadata-only ops that launch nothing (``torch.tensor`` under inference mode detaches in place)
_NOT_COMPUTE = {"detach_", "detach", "alias", "lift_fresh"}
# ops that only allocate (no kernel runs on a GPU)
_ALLOCATION = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
               "resize_"}


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, views and metadata-only ops excluded; with
    ``launches``, allocation-only ops are excluded too and each of vispos' custom ops counts as
    the kernels it declares (:func:`vispos.ops._triton.launches`): the kernels a GPU would launch."""

    def __init__(self, launches: bool = False) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.launches = launches

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        if not func.is_view and name not in _NOT_COMPUTE and not (self.launches and name in _ALLOCATION):
            weight = 1
            if self.launches and func.namespace == "vispos":
                from vispos.ops import _triton

                weight = _triton.launches(f"vispos::{name}") or 1
            self.ops[name if func.namespace == "aten" else f"{func.namespace}::{name}"] += weight
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object], launches: bool = False) -> tuple[int, collections.Counter]:
    """Compute ops (non-view aten ops) one call of ``fn`` dispatches, and their names; with
    ``launches``, the kernels they would launch on a GPU (see :class:`_OpCounter`)."""
    with _OpCounter(launches) as counter:
        out = fn()
    del out
    return sum(counter.ops.values()), counter.ops


def _host_side_switches() -> list:
    """The modules whose ``host_side`` the encoders ask (it moved between versions)."""
    found = []
    for name in ("vispos._sincos", "vispos._tracing"):
        try:
            module = importlib.import_module(name)
        except ImportError:  # pragma: no cover - a version without it
            continue
        if hasattr(module, "host_side"):
            found.append(module)
    return found


def count_device_ops(fn: Callable[[], object], launches: bool = False) -> tuple[int, collections.Counter]:
    """:func:`count_ops` with every host-side shortcut switched off (``host_side`` answers False),
    as on CUDA: the ops a GPU would launch, less the host-to-device copy of sizes that a CUDA
    call adds where it knows them on the host. With ``launches``, the kernels a GPU would launch
    (see :class:`_OpCounter`), those copies included (one per ``host_tensor`` / ``host_arrays``
    call, counted as ``"host-to-device copy"``)."""
    switches = _host_side_switches()
    saved = [m.host_side for m in switches]
    for m in switches:
        m.host_side = lambda device: False
    transfers = _counted_transfers() if launches else None
    try:
        n, ops = count_ops(fn, launches)
    finally:
        for m, f in zip(switches, saved):
            m.host_side = f
        if transfers is not None:
            transfers.restore()
    if transfers is not None and transfers.calls:
        ops["host-to-device copy"] += transfers.calls
        n += transfers.calls
    return n, ops


class _counted_transfers:  # noqa: N801 - used as a scoped switch
    """Counts the calls of ``vispos._tracing.host_tensor`` / ``host_arrays`` while alive: each is
    one non-blocking host-to-device copy on CUDA, and none on the CPU, where a count would miss it."""

    def __init__(self) -> None:
        import vispos._tracing as core

        self.core, self.calls, self.saved = core, 0, {}
        for name in ("host_tensor", "host_arrays"):
            original = self.saved[name] = getattr(core, name)

            def counted(*args, _original=original, **kwargs):
                self.calls += 1
                return _original(*args, **kwargs)

            setattr(core, name, counted)

    def restore(self) -> None:
        for name, original in self.saved.items():
            setattr(self.core, name, original)
