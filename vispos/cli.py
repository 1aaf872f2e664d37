"""The ``vispos`` command.

``vispos demo``: scikit-image's sample photos, batched with padding, through the default
config's backbone and position embedding; ``vispos run``: the same on the user's images.
Both print a table per feature level and write ``embeddings.pt`` and ``figure.png``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch

from .config import build_from_config, load_config
from .data import SAMPLE_IMAGES, imagenet_normalize, load_images, sample_images
from .nested_tensor import NestedTensor, nested_tensor_from_tensor_list

__all__ = ["main", "DEFAULT_CONFIG"]

#: the embedded default, identical to ``configs/detr_resnet50.yaml`` (a test pins this)
DEFAULT_CONFIG: dict[str, Any] = {
    "type": "Joiner",
    "backbone": {
        "type": "TimmBackbone",
        "model_name": "resnet50",
        "out_indices": [4],
        "pretrained": False,
        "checkpoint_path": None,
    },
    "position_embedding": {
        "type": "PositionEmbeddingSine",
        "num_pos_feats": 128,
        "temperature": 10000,
        "normalize": True,
    },
}


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vispos",
        description="Position embeddings for padded batches of real images on a real backbone.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, default_out: str) -> None:
        p.add_argument("--config", help="YAML config (default: the embedded DETR ResNet-50 config)")
        p.add_argument("--out", default=default_out, help=f"output folder (default: {default_out})")
        p.add_argument("--checkpoint", help="local backbone checkpoint (.pt/.safetensors); never downloaded")
        p.add_argument("--max-size", type=int, default=None, help="shrink images so the longest side is at most this")
        p.add_argument("--size-divisibility", type=int, default=0, help="pad to a multiple of this")
        p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
        p.add_argument("--queries", type=int, default=3, help="query cells per level in the figure")
        p.add_argument("--repeats", type=int, default=5, help="timing repeats per level (median reported)")

    demo = sub.add_parser("demo", help="run on scikit-image's shipped sample photos")
    common(demo, "vispos-demo")
    demo.add_argument("--samples", nargs="+", default=list(SAMPLE_IMAGES), help="scikit-image sample names")
    run = sub.add_parser("run", help="run on your own images")
    common(run, "vispos-out")
    run.add_argument("--images", nargs="+", required=True, help="image files")
    return parser


def _config(args: argparse.Namespace) -> dict[str, Any]:
    cfg = copy.deepcopy(DEFAULT_CONFIG) if args.config is None else load_config(args.config)
    if args.checkpoint is not None:
        backbone = cfg.get("backbone")
        if not isinstance(backbone, dict):
            raise CLIError("--checkpoint needs a config with a 'backbone' section")
        backbone["checkpoint_path"] = args.checkpoint
    return cfg


def _weights_note(cfg: dict[str, Any]) -> str:
    backbone = cfg.get("backbone", {}) if isinstance(cfg.get("backbone"), dict) else {}
    if backbone.get("checkpoint_path"):
        return f"backbone weights: loaded from {backbone['checkpoint_path']}"
    if backbone.get("pretrained"):
        return "backbone weights: timm pretrained (from timm's local cache)"
    return "backbone weights: random (no checkpoint given; vispos never downloads)"


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, sep, *body])


def _save_atomic(obj: Any, path: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".vispos-", suffix=".pt", dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _execute(args: argparse.Namespace, names: list[str], images: list[torch.Tensor]) -> None:
    from .viz import plot_position_similarity

    for flag in ("queries", "repeats"):
        if getattr(args, flag) < 1:
            raise CLIError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    cfg = _config(args)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise CLIError(f"--device {args.device!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda was asked for but no CUDA device is available")
    model = build_from_config(cfg).to(device).eval()
    batch = nested_tensor_from_tensor_list(
        [imagenet_normalize(im) for im in images], size_divisibility=args.size_divisibility
    ).to(device)

    with torch.inference_mode():
        t0 = time.perf_counter()
        features, pos = model(batch)
        total_ms = (time.perf_counter() - t0) * 1e3
        strides = list(getattr(model, "strides", [None] * len(features)))
        rows = []
        for lvl, (level, p) in enumerate(zip(features, pos)):
            ms = _median_ms(lambda lv=level: model.position_embedding(lv, dtype=lv.tensors.dtype), args.repeats)
            valid = 1.0 if level.mask is None else float((~level.mask).float().mean())
            rows.append([
                str(lvl), str(tuple(level.tensors.shape)), str(strides[lvl]), f"{valid:.3f}",
                str(tuple(p.shape)), f"{ms:.2f}",
            ])

    os.makedirs(args.out, exist_ok=True)
    print(f"vispos {args.command}: {len(images)} images -> batch {tuple(batch.tensors.shape)}, "
          f"padding {float(batch.mask.float().mean()):.1%} of the cells")
    for name, size in zip(names, batch.image_sizes):
        print(f"  {name}: {size[0]}x{size[1]}")
    print(_weights_note(cfg))
    print(_table(rows, ["level", "feature shape", "stride", "valid frac", "pos shape", "pos time (ms)"]))
    print(f"backbone + position embedding: {total_ms:.1f} ms on {device}")

    emb_path = os.path.join(args.out, "embeddings.pt")
    fig_path = os.path.join(args.out, "figure.png")
    _save_atomic(
        {
            "names": names,
            "image_sizes": batch.image_sizes,
            "config": cfg,
            "levels": [
                {"stride": s, "mask": lv.mask.cpu(), "pos": p.cpu(), "feature_shape": tuple(lv.tensors.shape)}
                for s, lv, p in zip(strides, features, pos)
            ],
        },
        emb_path,
    )
    plot_position_similarity(
        batch.to("cpu"), [lv.to("cpu") for lv in features], [p.cpu() for p in pos], fig_path,
        names=names, strides=strides, n_queries=args.queries,
    )
    print(f"wrote {emb_path}")
    print(f"wrote {fig_path}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vispos`` command. Returns the exit status (0 ok, 2 user error)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            samples = sample_images(args.samples, max_size=args.max_size)
            names = [n for n, _ in samples]
            images = [im for _, im in samples]
        else:
            names = [os.path.basename(p) for p in args.images]
            images = load_images(args.images, max_size=args.max_size)
        _execute(args, names, images)
    except (CLIError, ValueError, TypeError, FileNotFoundError, ImportError, OSError) as exc:
        print(f"vispos: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
