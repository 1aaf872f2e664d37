"""Backbone checkpoints: local state dicts, loaded with a report of what matched.

Nothing is downloaded; ``.pt`` files are read with ``weights_only=True``. A wrapper prefix
(``module.``, DETR's ``backbone.0.body.``) is stripped when that makes more keys match.

Private module; the public names are re-exported by :mod:`vispos.backbones`.

References:
    Carion et al., DETR ``models/backbone.py`` (checkpoint key layout); safetensors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["load_checkpoint_state", "load_state_with_report", "format_load_report"]

log = logging.getLogger("vispos.backbones")

_PREFIXES = ("module.", "model.", "backbone.0.body.", "backbone.body.", "backbone.", "body.")
# buffers a checkpoint may lack without changing the computation
_OPTIONAL_SUFFIXES = ("num_batches_tracked",)


def load_checkpoint_state(path: str | os.PathLike) -> dict[str, Tensor]:
    """Reads a state dict from a local ``.pt`` / ``.pth`` / ``.bin`` or ``.safetensors`` file.

    A checkpoint that wraps the weights (``{"model": ...}``, ``{"state_dict": ...}``) is unwrapped.
    Nothing is downloaded; ``.pt`` files are read with ``weights_only=True``.

    Args:
        path (str | PathLike): the file.

    Returns:
        dict[str, Tensor]: the state dict, tensors on the CPU.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is corrupt or truncated, or holds no mapping of names to tensors.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint_path {path!r} does not exist or is not a file")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state: Any = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except ImportError:
        raise
    except Exception as exc:  # a truncated / corrupt file: pickle, zip and safetensors errors
        raise ValueError(
            f"checkpoint_path {path!r} could not be read as a torch or safetensors state dict "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from exc
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, Mapping) and key in state and isinstance(state[key], Mapping):
            state = state[key]
            break
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"checkpoint_path {path!r} does not hold a state dict of tensors")
    return dict(state)


def _strip_prefixes(state: Mapping[str, Tensor], own: set[str]) -> tuple[dict[str, Tensor], str]:
    """Drops a wrapper prefix (``module.``, DETR's ``backbone.0.body.``, ...) when that makes more
    keys match the model's own; returns the new dict and the prefix dropped (``""`` if none)."""
    best, best_prefix = dict(state), ""
    best_hits = len(own & best.keys())
    for prefix in _PREFIXES:
        stripped = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
        hits = len(own & stripped.keys())
        if hits > best_hits:
            best, best_hits, best_prefix = stripped, hits, prefix
    return best, best_prefix


def load_state_with_report(
    module: nn.Module, state: Mapping[str, Tensor], source: str = "checkpoint_path"
) -> dict[str, Any]:
    """Loads ``state`` into ``module`` (after stripping a wrapper prefix) and reports what happened.

    Keys the module lacks (a classifier head, say) are ignored and reported; keys the module needs
    but ``state`` lacks, and tensors of the wrong shape, raise. ``num_batches_tracked`` buffers may
    be absent (DETR's FrozenBatchNorm checkpoints have none).

    Args:
        module (nn.Module): receives the weights (modified in place: it is the adapter's own copy).
        state (Mapping[str, Tensor]): e.g. from :func:`load_checkpoint_state`; not modified.
        source (str): names the checkpoint in messages.

    Returns:
        dict: ``{"source": str, "prefix_stripped": str, "loaded": [keys], "missing": [keys],
        "unexpected": [keys]}`` (``missing`` is always empty: missing weights raise).

    Raises:
        ValueError: weights the module needs are missing, or have another shape (the message
            names up to five of them and the keys the file does hold).
    """
    own_state = module.state_dict()
    own = set(own_state)
    stripped, prefix = _strip_prefixes(state, own)
    missing = sorted(k for k in own - stripped.keys() if not k.endswith(_OPTIONAL_SUFFIXES))
    unexpected = sorted(stripped.keys() - own)
    if missing:
        raise ValueError(
            f"{source}: checkpoint {source!r} lacks {len(missing)} backbone weights, e.g. "
            f"{missing[:5]}; it holds keys such as {sorted(stripped)[:5]}"
        )
    mismatched = [
        f"{k}: checkpoint {tuple(stripped[k].shape)} vs backbone {tuple(own_state[k].shape)}"
        for k in sorted(own & stripped.keys())
        if tuple(stripped[k].shape) != tuple(own_state[k].shape)
    ]
    if mismatched:
        raise ValueError(
            f"{source}: {len(mismatched)} checkpoint tensors have the wrong shape, e.g. {mismatched[:5]}"
        )
    loaded = sorted(own & stripped.keys())
    module.load_state_dict({k: stripped[k] for k in loaded}, strict=False)
    report = {
        "source": source,
        "prefix_stripped": prefix,
        "loaded": loaded,
        "missing": missing,
        "unexpected": unexpected,
    }
    log.info("%s", format_load_report(report))
    return report


def format_load_report(report: Mapping[str, Any]) -> str:
    """One line summarising a load report from :func:`load_state_with_report`."""
    unexpected = list(report.get("unexpected", []))
    text = (
        f"loaded {len(report.get('loaded', []))} tensors from {report.get('source')!r}"
        + (f" (prefix {report['prefix_stripped']!r} stripped)" if report.get("prefix_stripped") else "")
        + f"; missing {len(report.get('missing', []))}; ignored {len(unexpected)} keys not in the backbone"
    )
    if unexpected:
        text += f", e.g. {unexpected[:5]}"
    return text
