"""Training checkpoints of the demos: written all or nothing, read back without unpickling code.

A checkpoint is one ``torch.save`` file holding the step, the model, optimizer and scheduler
states, every process's RNG states (torch CPU and CUDA, NumPy, Python), the data sampler's
position (epoch, samples of the epoch already taken, shuffle seed), the metrics so far and the
run's arguments. It is written through :func:`vispos.app._io.write_files` (temporary file,
fsync, rename), so an interrupted save leaves the previous checkpoint intact, and read with
``torch.load(weights_only=True)`` (tensors and plain containers only).

References:
    DETR ``main.py`` (``checkpoint.pth`` with model, optimizer, lr_scheduler, epoch, args);
    PyTorch "Saving and loading a general checkpoint".
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from vispos.app._io import write_files

__all__ = ["rng_state", "set_rng_state", "save_checkpoint", "load_checkpoint"]


def rng_state() -> dict[str, Any]:
    """This process's random states: torch (CPU and every CUDA device), NumPy's legacy global
    generator and Python's ``random``, as tensors and plain lists (``weights_only``-loadable)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss_next],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> str:
    """Writes ``state`` to ``path`` all or nothing (missing folders are created).

    Returns:
        str: the path written.

    Raises:
        OSError / ValueError: from :func:`vispos.app._io.write_files` (nothing is left behind).
    """
    return write_files([(path, lambda tmp: torch.save(state, tmp))], make_dirs=True)[0]


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a checkpoint written by :func:`save_checkpoint` onto the CPU.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a checkpoint of these demos: unreadable (empty, truncated,
            not a ``torch.save`` file, a folder; the message names torch's exception) or without
            a checkpoint's keys.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # a truncated or foreign file: say which, not torch's unpickler trace
        # torch's own words can be empty (EOFError of an empty file) or a bare number (KeyError(101)
        # of a text file): name the exception, and what a file that is none of these must be
        reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")
        what = "" if isinstance(exc, OSError) else " (empty, truncated, or not written by torch.save)"
        raise ValueError(f"{os.fspath(path)!r} is not a readable checkpoint{what}: {reason}") from exc
    keys = set(state) if isinstance(state, dict) else set()
    missing = {"step", "model", "optimizer", "scheduler", "rng", "sampler", "metrics", "args"} - keys
    if missing:
        raise ValueError(f"{os.fspath(path)!r} is not a training checkpoint (missing {sorted(missing)})")
    return state
