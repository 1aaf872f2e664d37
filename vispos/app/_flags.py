"""The flag pieces every ``vispos`` subcommand shares: the value types (:func:`int_at_least`,
:func:`positive_float`, :func:`nonnegative_float`) and ``--threads`` (``demo``, ``run``, ``plot``,
``train``: one definition, one default rule, one place where it is applied).

torch-free at import (the parsers read it before torch is imported); :func:`torch_threads`
imports torch when it runs.

Why a default of at most :data:`MAX_DEFAULT_THREADS`: the position embeddings are many small ops
(a few hundred KB each), and an OpenMP team larger than the cores it runs on only adds
synchronisation to them. Measured on a 2-core machine (``PositionEmbeddingSine(128,
normalize=True)`` on a padded ``(3, 8, 25, 34)`` level, uncached, median of 30): 0.30 ms with 1
or 2 threads, 0.51 ms with 4 and 0.83 ms with 8; a 64-channel 3x3 convolution on ``(2, 64, 100,
100)`` (the backbone's kind of work) takes 14 ms with 1 thread and 7 ms with 2. So as many threads
as cores, the backbone's gain, and never more than the machine's cores; past 4 the small ops of
the embedding gain nothing (torch's own default takes every physical core).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Callable, Iterator

__all__ = [
    "int_at_least", "positive_float", "nonnegative_float",
    "MAX_DEFAULT_THREADS", "MAX_THREADS", "available_cores", "default_threads", "add_threads_argument", "torch_threads",
]


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an int ``>= minimum`` (and ``<= maximum`` when given; the error names
    the flag, via argparse)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def _float(text: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if positive else '>='} 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite float > 0."""
    return _float(text, True)


def nonnegative_float(text: str) -> float:
    """An argparse ``type``: a finite float >= 0."""
    return _float(text, False)


#: the largest default of ``--threads`` (any value up to :data:`MAX_THREADS` may be given)
MAX_DEFAULT_THREADS = 4
#: the largest ``--threads``: past the cores of any machine we know of; a larger number reached
#: torch as it was (``--threads 3000000000``: ``torch.set_num_threads``'s overflow traceback;
#: ``2147483647`` was taken, and the first parallel op would start that many threads)
MAX_THREADS = 1024


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under ``taskset`` or a
    container's cpuset), else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _from_env() -> int | None:
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def default_threads() -> tuple[int, str]:
    """The default ``--threads`` on this machine and why: ``OMP_NUM_THREADS`` when it is set to a
    positive int (the user chose), else ``min(4, cores)`` (:data:`MAX_DEFAULT_THREADS`,
    :func:`available_cores`)."""
    env = _from_env()
    if env is not None:
        return env, "$OMP_NUM_THREADS"
    cores = available_cores()
    return min(MAX_DEFAULT_THREADS, cores), f"min({MAX_DEFAULT_THREADS}, {cores} cores)"


def add_threads_argument(group: argparse.ArgumentParser | argparse._ArgumentGroup, machine_default: bool = True) -> None:
    """Adds ``--threads N`` to a parser or an argument group.

    Args:
        group: where the flag goes.
        machine_default (bool): the default is :func:`default_threads` (stated in ``--help``), and 0
            is refused; False: 0 is taken and is the default, all cores (torch's own default, one
            thread per physical core; ``vispos train``, whose documented runs name it).
    """
    if machine_default:
        n, why = default_threads()
        group.add_argument("--threads", type=int_at_least(1, MAX_THREADS), default=n,
                           help=f"torch threads (default here: {n} = {why}; threads beyond the cores slow the "
                                "embedding's small ops, fewer than the cores slow the backbone)")
    else:
        group.add_argument("--threads", type=int_at_least(0, MAX_THREADS), default=0,
                           help=f"torch threads per process (default 0: all cores, torch's own default of one "
                                f"thread per physical core; at most {MAX_THREADS})")


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Runs the body with ``torch.set_num_threads(threads)`` and restores the number before it
    (``None`` or 0: left as it is, torch's default)."""
    if not threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
