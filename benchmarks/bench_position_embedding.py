"""Position embeddings side by side: vispos, the peers' own packages, and the write-once floor.

Run:  python benchmarks/bench_position_embedding.py [--device cpu|cuda] [--repeats N] [--quick]

For every workload each implementation runs in one process, interleaved (A B C A B C ...), so
that machine drift hits all alike. Reported per implementation:

* median time (ms) and its ratio to the floor (allocate the output and fill it once);
* peak memory of one call, outputs included, and its ratio to the output's size. On CPU this is
  the resident high-water mark (``VmHWM`` after resetting it through ``/proc/self/clear_refs``)
  minus the resident size before the call, with glibc told to serve large blocks by ``mmap`` so
  that freed memory leaves the process; on CUDA ``torch.cuda.max_memory_allocated``.
* "cached" rows call a warm module with the same input again.

Peers that ignore the mask (positional-encodings, timm, MONAI) compute an unmasked grid of the
padded size; timm and MONAI build one grid without a batch axis. Timings are not tests.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import vispos  # noqa: E402
from vispos import PositionEmbeddingSine, nested_tensor_from_tensor_list  # noqa: E402

IMAGES = [(800, 1066), (800, 1201), (736, 1333), (800, 1088)]


def _malloc_setup() -> None:
    """Large blocks via mmap (returned to the OS on free), so RSS tracks live memory."""
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        del out
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    out = fn()
    ms = (time.perf_counter() - t0) * 1e3
    del out
    return ms


@dataclass
class Workload:
    name: str
    out_bytes: int
    impls: dict[str, Callable[[], object]] = field(default_factory=dict)


def _level_masks(images, strides, device, n_spatial=2):
    """Rectangular NestedTensor levels of a padded image batch at the given strides."""
    items = [torch.zeros(1, *s) for s in images]
    nt = nested_tensor_from_tensor_list(items)
    levels = []
    for s in strides:
        size = [math.ceil(v / s) for v in nt.tensors.shape[2:]]
        levels.append(nt.with_features(torch.empty(len(images), 1, *size)).to(device))
    return levels


def _arbitrary(mask: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    holes = torch.rand(mask.shape, generator=g) < 0.05
    return (mask.cpu() | holes).to(mask.device)


def _uncached_pe(module, x):
    """positional-encodings keeps the last result (``cached_penc``); drop it to time the work."""
    module.cached_penc = None
    inner = getattr(module, "penc", None)  # the Permute classes wrap the channel-last encoder
    if inner is not None:
        inner.cached_penc = None
    return module(x)


def _fill_floor(shapes, device):
    def run():
        outs = []
        for shape in shapes:
            t = torch.empty(shape, device=device)
            t.fill_(1.0)
            outs.append(t)
        return outs

    return run


def _peers_2d(wl: Workload, levels, feats, temperature, normalize, offset, device, grid_peers=True):
    try:
        from transformers.models.deformable_detr.modeling_deformable_detr import (
            DeformableDetrSinePositionEmbedding as Deform,
        )
        from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding as Detr
    except ImportError:  # pragma: no cover
        Detr = Deform = None
    masks = [lv.mask for lv in levels]
    pixel = [(~m).long() for m in masks]
    shapes = [(m.shape[0], 1, *m.shape[1:]) for m in masks]
    if Detr is not None:
        peer = Deform if offset == -0.5 else Detr
        name = "transformers Deformable-DETR" if offset == -0.5 else "transformers DETR"
        raw = peer.build_sine_position_embedding.__wrapped__
        scale = 2 * math.pi
        wl.impls[name] = lambda: [
            raw(s, device, torch.float32, feats, normalize, scale, temperature, p) for s, p in zip(shapes, pixel)
        ]
    if not grid_peers:
        return
    try:
        from positional_encodings.torch_encodings import PositionalEncodingPermute2D
    except ImportError:  # pragma: no cover
        PositionalEncodingPermute2D = None
    if PositionalEncodingPermute2D is not None:
        xs = [torch.zeros(m.shape[0], 2 * feats, *m.shape[1:], device=device) for m in masks]
        pe = PositionalEncodingPermute2D(2 * feats).to(device)
        wl.impls["positional-encodings (no mask)"] = lambda: [_uncached_pe(pe, x) for x in xs]
    try:
        from timm.layers import build_sincos2d_pos_embed
    except ImportError:  # pragma: no cover
        build_sincos2d_pos_embed = None
    if build_sincos2d_pos_embed is not None:
        wl.impls["timm sincos2d (no mask, 1 grid)"] = lambda: [
            build_sincos2d_pos_embed(list(m.shape[1:]), 2 * feats, temperature, device=device) for m in masks
        ]
    try:
        from monai.networks.blocks.pos_embed_utils import build_sincos_position_embedding
    except ImportError:  # pragma: no cover
        build_sincos_position_embedding = None
    if build_sincos_position_embedding is not None and device.type == "cpu":
        wl.impls["MONAI sincos (no mask, 1 grid)"] = lambda: [
            build_sincos_position_embedding(list(m.shape[1:]), 2 * feats, 2, temperature) for m in masks
        ]


def _vispos_rows(wl: Workload, levels, feats, temperature, normalize, offset, device, arbitrary=True):
    pe = PositionEmbeddingSine(feats, temperature, normalize, offset=offset, cache_size=0).to(device)
    wl.impls["vispos (NestedTensor, rectangular)"] = lambda: [pe(lv) for lv in levels]
    if arbitrary:
        masks = [_arbitrary(lv.mask) for lv in levels]
        wl.impls["vispos (arbitrary mask)"] = lambda: [pe(m) for m in masks]
    cached = PositionEmbeddingSine(feats, temperature, normalize, offset=offset, cache_size=16).to(device)
    for lv in levels:
        cached(lv)
    wl.impls["vispos cached"] = lambda: [cached(lv) for lv in levels]


def _grid_rows(wl: Workload, levels, channels, device):
    """vispos' positional-encodings-compatible grid encoder, when it is there."""
    n = levels[0].tensors.dim() - 2
    cls = getattr(vispos, f"PositionalEncodingPermute{n}D", None)
    if cls is None:
        return
    xs = [torch.zeros(lv.tensors.shape[0], channels, *lv.tensors.shape[2:], device=device) for lv in levels]
    enc = cls(channels, cache=False).to(device)
    wl.impls[f"vispos PositionalEncodingPermute{n}D (no mask)"] = lambda: [enc(x) for x in xs]
    warm = cls(channels).to(device)
    for x in xs:
        warm(x)
    wl.impls[f"vispos PositionalEncodingPermute{n}D cached"] = lambda: [warm(x) for x in xs]


def build_workloads(device: torch.device, quick: bool) -> list[Workload]:
    wls = []
    scale_down = 2 if quick else 1

    imgs = [(h // scale_down, w // scale_down) for h, w in IMAGES]
    levels = _level_masks(imgs, [32], device)
    shapes = [(lv.tensors.shape[0], 256, *lv.tensors.shape[2:]) for lv in levels]
    wl = Workload("DETR C5: 4 images, stride 32, 256 ch, normalize", sum(math.prod(s) * 4 for s in shapes))
    wl.impls["floor (alloc + fill)"] = _fill_floor(shapes, device)
    _vispos_rows(wl, levels, 128, 10000, True, 0.0, device)
    _grid_rows(wl, levels, 256, device)
    _peers_2d(wl, levels, 128, 10000, True, 0.0, device)
    wls.append(wl)

    levels = _level_masks(imgs[:2], [8, 16, 32, 64], device)
    shapes = [(lv.tensors.shape[0], 256, *lv.tensors.shape[2:]) for lv in levels]
    wl = Workload("Deformable-DETR: 2 images, strides 8-64, offset -0.5", sum(math.prod(s) * 4 for s in shapes))
    wl.impls["floor (alloc + fill)"] = _fill_floor(shapes, device)
    _vispos_rows(wl, levels, 128, 10000, True, -0.5, device)
    _grid_rows(wl, levels, 256, device)
    _peers_2d(wl, levels, 128, 10000, True, -0.5, device)
    wls.append(wl)

    levels = _level_masks(imgs[:2], [4], device)
    shapes = [(lv.tensors.shape[0], 256, *lv.tensors.shape[2:]) for lv in levels]
    wl = Workload("stride 4: 2 images, 256 ch, normalize", sum(math.prod(s) * 4 for s in shapes))
    wl.impls["floor (alloc + fill)"] = _fill_floor(shapes, device)
    _vispos_rows(wl, levels, 128, 10000, True, 0.0, device)
    _grid_rows(wl, levels, 256, device)
    _peers_2d(wl, levels, 128, 10000, True, 0.0, device)
    wls.append(wl)

    vols = [(64, 64, 64), (48, 64, 56)] if not quick else [(32, 32, 32), (24, 32, 28)]
    nt = nested_tensor_from_tensor_list([torch.zeros(1, *v) for v in vols]).to(device)
    levels = [nt]
    shapes = [(2, 96, *nt.tensors.shape[2:])]
    wl = Workload("3D volumes: 64^3 + 48x64x56, 32 feats/axis", sum(math.prod(s) * 4 for s in shapes))
    wl.impls["floor (alloc + fill)"] = _fill_floor(shapes, device)
    _vispos_rows(wl, levels, 32, 10000, True, 0.0, device)
    _grid_rows(wl, levels, 96, device)
    try:
        from positional_encodings.torch_encodings import PositionalEncodingPermute3D

        x3 = torch.zeros(2, 96, *nt.tensors.shape[2:], device=device)
        pe3 = PositionalEncodingPermute3D(96).to(device)
        wl.impls["positional-encodings (no mask)"] = lambda: _uncached_pe(pe3, x3)
    except ImportError:  # pragma: no cover
        pass
    try:
        from monai.networks.blocks.pos_embed_utils import build_sincos_position_embedding

        if device.type == "cpu":
            grid3 = list(nt.tensors.shape[2:])
            wl.impls["MONAI sincos (no mask, 1 grid)"] = lambda: build_sincos_position_embedding(
                grid3, 96, 3, 10000.0
            )
    except ImportError:  # pragma: no cover
        pass
    wls.append(wl)

    length = 4096 // scale_down
    seqs = [torch.zeros(1, length)] * 8 + [torch.zeros(1, 3000 // scale_down)] * 8
    nt = nested_tensor_from_tensor_list(seqs).to(device)
    shapes = [(16, 1024, length)]
    wl = Workload("1D: 16 x 4096, half padded to 3000, 1024 ch", sum(math.prod(s) * 4 for s in shapes))
    wl.impls["floor (alloc + fill)"] = _fill_floor(shapes, device)
    _vispos_rows(wl, [nt], 1024, 10000, False, 0.0, device)
    _grid_rows(wl, [nt], 1024, device)
    try:
        from positional_encodings.torch_encodings import PositionalEncodingPermute1D

        x1 = torch.zeros(16, 1024, length, device=device)
        pe1 = PositionalEncodingPermute1D(1024).to(device)
        wl.impls["positional-encodings (no mask)"] = lambda: _uncached_pe(pe1, x1)
    except ImportError:  # pragma: no cover
        pass
    wls.append(wl)
    return wls


def run(device: torch.device, repeats: int, quick: bool) -> list[tuple[str, list[tuple]]]:
    results = []
    for wl in build_workloads(device, quick):
        names = list(wl.impls)
        with torch.inference_mode():
            for name in names:  # warm-up
                time_once(wl.impls[name], device)
            times: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(repeats):
                for name in names:  # interleaved: A B C A B C ...
                    times[name].append(time_once(wl.impls[name], device))
            peaks = {n: peak_bytes(wl.impls[n], device) for n in names}
        floor = statistics.median(times["floor (alloc + fill)"])
        rows = []
        for name in names:
            med = statistics.median(times[name])
            rows.append((name, med, med / floor, peaks[name] / 2**20, peaks[name] / wl.out_bytes))
        results.append((f"{wl.name} (output {wl.out_bytes / 2**20:.1f} MiB)", rows))
    return results


def format_table(results) -> str:
    lines = []
    for title, rows in results:
        lines.append(f"\n### {title}\n")
        lines.append("| implementation | median ms | x floor | peak MiB | x output |")
        lines.append("|---|---:|---:|---:|---:|")
        for name, med, ratio, peak, pratio in rows:
            lines.append(f"| {name} | {med:.2f} | {ratio:.2f} | {peak:.1f} | {pratio:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="half-size workloads (a smoke run)")
    args = parser.parse_args(argv)
    _malloc_setup()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device available", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, repeats {args.repeats}")
    print(format_table(run(device, args.repeats, args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
