"""Position embeddings side by side: vispos, the peers' own packages, and the write-once floor.

Run:  python benchmarks/bench_position_embedding.py [--device cpu|cuda] [--repeats N] [--quick]
      python benchmarks/bench_position_embedding.py --ab BEFORE [--ab-after AFTER] [...]

Three passes, in this order, each over every workload:

1. **Time, steady state.** The allocator keeps its default behaviour (glibc's on CPU, the caching
   allocator on CUDA), so freed blocks are reused as in a training or inference loop. Every
   implementation is warmed up, then the implementations run interleaved (A B C A B C ...) so
   that drift and the other processes on a shared machine hit all alike. One sample is the mean
   of ``k`` back-to-back calls (``k`` chosen per workload so that one sample of the floor takes
   about 2 ms); the table shows the median over ``--repeats`` samples. On CUDA a sample is timed
   with CUDA events around the ``k`` calls.
2. **Compute ops per call.** One call under a ``TorchDispatchMode`` that counts the aten ops
   dispatched, views (``func.is_view``) and metadata-only ops (``detach_``) excluded: a
   device-independent proxy for the kernel launches the call costs on a GPU.
3. **Peak memory, one call, outputs included.** On CPU the resident high-water mark (``VmHWM``
   after resetting it through ``/proc/self/clear_refs``) minus the resident size before the
   call, with glibc told (only for this pass) to serve every block over 128 KiB by a fresh
   ``mmap``, so that freed memory leaves the process and the high-water mark sees each block;
   on CUDA ``torch.cuda.max_memory_allocated``.

Reported per implementation: median ms, its ratio to the floor (allocate the output and fill it
once), ops per call, for vispos' sine rows also the ops of the device branch (``device ops``:
the same count with every host-side shortcut switched off, as on CUDA, which adds one
host-to-device copy of the sizes where it knows them on the host), peak MiB and its ratio to
the output's size.

The rows of the loop as it runs (issue 23). vispos' sine rows draw a **new batch every call**
(``FreshBatches``: the workload's padded shape with other per-item sizes and other holes, the
same padded axes per item, so the same work; built before each timed pass, never inside it):
"vispos (...)" is a module with the cache off (``cache_size=0``), "..., default module, new
sizes every call" one persistent module with default settings fed the same batches, i.e. a
training loop whose sizes change every step (its cache must end the pass without a single hit,
or the benchmark stops). "cached" rows call a warm module with the same input again: "copy out"
is the default (a hit is copied into an output the caller owns), "zero_copy" the shared opt-in
(the cached tensor itself). Peers that ignore the mask (positional-encodings, timm, MONAI)
compute an unmasked grid of the padded size; timm and MONAI build one grid without a batch
axis. Timings are not tests.

``--ab BEFORE`` measures two checkouts in one run: each in its own worker process (this script,
with ``BEFORE``'s or ``--ab-after``'s ``vispos``), every sample alternating between them (the
order flipping every repeat), each row's ratio taken to its own worker's floor; peers run in the
"after" worker only, peak memory per checkout in its own process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# the checkout to measure: this one, or the one an A/B worker was started for (``--ab``)
_ROOT = os.environ.get("VISPOS_BENCH_ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, _ROOT)

sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # the helpers beside this script

import vispos  # noqa: E402
from _fresh import FreshBatches, FreshInputs, arbitrary, fresh_levels, shrink  # noqa: E402
from _measure import count_device_ops, count_ops, malloc_setup, peak_bytes, time_sample  # noqa: E402
from vispos import PositionEmbeddingSine, nested_tensor_from_tensor_list  # noqa: E402

FLOOR = "floor (alloc + fill)"
IMAGES = [(800, 1066), (800, 1201), (736, 1333), (800, 1088)]


@dataclass
class Workload:
    name: str
    out_bytes: int
    impls: dict[str, Callable[[], object]] = field(default_factory=dict)
    #: inputs drawn afresh on every call (see ``FreshInputs``): prepared before each timed pass
    fresh: list = field(default_factory=list)
    #: (row, module) whose cache must end a pass without a single hit (new sizes every call)
    never_hit: list = field(default_factory=list)
    #: rows whose ops are also counted on the device branch (``count_device_ops``)
    device_rows: list = field(default_factory=list)

    def prepare(self, calls: int) -> None:
        """Builds the fresh inputs of the next ``calls`` calls of every row (outside timing) and
        drops those every row has used."""
        for cursor in self.fresh:
            cursor.prepare(calls)
        for batches in {id(c.batches): c.batches for c in self.fresh}.values():
            batches.release(min(c.next for c in self.fresh if c.batches is batches))

    def check_never_hit(self) -> None:
        """The "new sizes every call" rows really were: their caches served nothing."""
        for row, module in self.never_hit:
            info = module.cache_info()
            if info.hits:
                raise RuntimeError(f"{row}: {info.hits} cache hits on inputs meant to be new every call")


def _level_masks(images, strides, device, n_spatial=2):
    """Rectangular NestedTensor levels of a padded image batch at the given strides."""
    items = [torch.zeros(1, *s) for s in images]
    nt = nested_tensor_from_tensor_list(items)
    levels = []
    for s in strides:
        size = [math.ceil(v / s) for v in nt.tensors.shape[2:]]
        levels.append(nt.with_features(torch.empty(len(images), 1, *size)).to(device))
    return levels


def _fresh_rows(wl: Workload, batches: FreshBatches, feats, temperature, normalize, offset, device, arbitrary=True):
    """Per input kind: the cache-off row and the persistent default module's row, both over new
    batches every call (the same batches, in the same order)."""
    off = PositionEmbeddingSine(feats, temperature, normalize, offset=offset, cache_size=0).to(device)
    kinds = [("nested", "NestedTensor, rectangular"), ("mask", "bool mask, rectangular")]
    kinds += [("arbitrary", "arbitrary mask")] if arbitrary else []
    for kind, label in kinds:
        default = PositionEmbeddingSine(feats, temperature, normalize, offset=offset).to(device)
        cold, new = FreshInputs(batches, kind), FreshInputs(batches, kind)
        wl.fresh += [cold, new]
        wl.impls[f"vispos ({label})"] = lambda cold=cold: [off(x) for x in cold()]
        row = f"vispos ({label}), default module, new sizes every call"
        wl.impls[row] = lambda new=new, m=default: [m(x) for x in new()]
        wl.never_hit.append((row, default))
        wl.device_rows += [f"vispos ({label})", row]


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


def _vispos_rows(wl: Workload, levels, batches, feats, temperature, normalize, offset, device, arbitrary=True):
    """The cache-off and default-module rows over new batches every call (``_fresh_rows``), then
    the cache hits on the fixed batch ``levels``."""
    _fresh_rows(wl, batches, feats, temperature, normalize, offset, device, arbitrary)
    # cache hits: no byte bound here so that every workload is a hit (the default 8 MiB budget
    # stores only the small ones); the default hands out a copy, zero_copy the cached tensor
    cached = PositionEmbeddingSine(
        feats, temperature, normalize, offset=offset, cache_size=16, cache_bytes=None
    ).to(device)
    shared = PositionEmbeddingSine(
        feats, temperature, normalize, offset=offset, cache_size=16, cache_bytes=None, zero_copy=True
    ).to(device)
    for lv in levels:
        for _ in range(2):  # a result is stored on the second sighting of its input
            cached(lv)
            shared(lv)
    wl.impls["vispos cached (NestedTensor), copy out"] = lambda: [cached(lv) for lv in levels]
    wl.impls["vispos cached (NestedTensor), zero_copy"] = lambda: [shared(lv) for lv in levels]


def _grid_rows(wl: Workload, levels, channels, device):
    """vispos' positional-encodings-compatible grid encoder, when it is there."""
    n = levels[0].tensors.dim() - 2
    cls = getattr(vispos, f"PositionalEncodingPermute{n}D", None)
    if cls is None:
        return
    xs = [torch.zeros(lv.tensors.shape[0], channels, *lv.tensors.shape[2:], device=device) for lv in levels]
    enc = cls(channels, cache=False).to(device)
    wl.impls[f"vispos PositionalEncodingPermute{n}D (no mask)"] = lambda: [enc(x) for x in xs]
    warm = cls(channels, cache_bytes=None).to(device)
    for x in xs:
        warm(x)
        warm(x)
    wl.impls[f"vispos PositionalEncodingPermute{n}D cached, copy out"] = lambda: [warm(x) for x in xs]


def build_workloads(device: torch.device, quick: bool, grid_peers: bool = True) -> list[Workload]:
    """Every workload; ``grid_peers=False`` leaves out the peers that ignore the mask
    (positional-encodings, timm, MONAI), and so their imports."""
    wls = []
    scale_down = 2 if quick else 1

    imgs = [(h // scale_down, w // scale_down) for h, w in IMAGES]
    levels = _level_masks(imgs, [32], device)
    shapes = [(lv.tensors.shape[0], 256, *lv.tensors.shape[2:]) for lv in levels]
    wl = Workload("DETR C5: 4 images, stride 32, 256 ch, normalize", sum(math.prod(s) * 4 for s in shapes))
    wl.impls[FLOOR] = _fill_floor(shapes, device)
    # items 0, 1, 3 padded along W only, item 2 along H only, in every batch (as in this one)
    keep, width, height = range(0, 1), shrink(imgs[0][1], 32, 0, 16), shrink(imgs[2][0], 32, 0, 8)
    vary = [((0,), [keep, width]), ((1,), [keep, width]), ((3,), [keep, width]), ((2,), [height, keep])]
    fresh = fresh_levels(imgs, [32], vary, device, scale=32)
    _vispos_rows(wl, levels, fresh, 128, 10000, True, 0.0, device)
    _grid_rows(wl, levels, 256, device)
    _peers_2d(wl, levels, 128, 10000, True, 0.0, device, grid_peers)
    wls.append(wl)

    levels = _level_masks(imgs[:2], [8, 16, 32, 64], device)
    shapes = [(lv.tensors.shape[0], 256, *lv.tensors.shape[2:]) for lv in levels]
    wl = Workload("Deformable-DETR: 2 images, strides 8-64, offset -0.5", sum(math.prod(s) * 4 for s in shapes))
    wl.impls[FLOOR] = _fill_floor(shapes, device)
    # every level must change: item 0 shrinks by 64 px steps, along both axes (so it is padded
    # along H too, unlike the cached batch: the cache-off row sees the same batches)
    steps = [shrink(imgs[0][0], 64, 1, 12), shrink(imgs[0][1], 64, 0, 16)]
    fresh = fresh_levels(imgs[:2], [8, 16, 32, 64], [((0,), steps)], device, scale=64)
    _vispos_rows(wl, levels, fresh, 128, 10000, True, -0.5, device)
    _grid_rows(wl, levels, 256, device)
    _peers_2d(wl, levels, 128, 10000, True, -0.5, device, grid_peers)
    wls.append(wl)

    levels = _level_masks(imgs[:2], [4], device)
    shapes = [(lv.tensors.shape[0], 256, *lv.tensors.shape[2:]) for lv in levels]
    wl = Workload("stride 4: 2 images, 256 ch, normalize", sum(math.prod(s) * 4 for s in shapes))
    wl.impls[FLOOR] = _fill_floor(shapes, device)
    steps = [range(0, 1), shrink(imgs[0][1], 4, 0, 60)]  # item 0 padded along W only
    fresh = fresh_levels(imgs[:2], [4], [((0,), steps)], device, scale=4)
    _vispos_rows(wl, levels, fresh, 128, 10000, True, 0.0, device)
    _grid_rows(wl, levels, 256, device)
    _peers_2d(wl, levels, 128, 10000, True, 0.0, device, grid_peers)
    wls.append(wl)

    vols = [(64, 64, 64), (48, 64, 56)] if not quick else [(32, 32, 32), (24, 32, 28)]
    nt = nested_tensor_from_tensor_list([torch.zeros(1, *v) for v in vols]).to(device)
    levels = [nt]
    shapes = [(2, 96, *nt.tensors.shape[2:])]
    wl = Workload("3D volumes: 64^3 + 48x64x56, 32 feats/axis", sum(math.prod(s) * 4 for s in shapes))
    wl.impls[FLOOR] = _fill_floor(shapes, device)
    steps = [shrink(vols[1][0], 1, 0, 8), range(0, 1), shrink(vols[1][2], 1, 0, 8)]  # D, W padded
    fresh = fresh_levels(vols, [1], [((1,), steps)], device)
    _vispos_rows(wl, levels, fresh, 32, 10000, True, 0.0, device)
    _grid_rows(wl, levels, 96, device)
    if grid_peers:
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
    wl.impls[FLOOR] = _fill_floor(shapes, device)
    lengths = [(length,)] * 8 + [(3000 // scale_down,)] * 8
    fresh = fresh_levels(lengths, [1], [(tuple(range(8, 16)), [range(0, 1000 // scale_down)])], device)
    _vispos_rows(wl, [nt], fresh, 1024, 10000, False, 0.0, device)
    _grid_rows(wl, [nt], 1024, device)
    if grid_peers:
        try:
            from positional_encodings.torch_encodings import PositionalEncodingPermute1D

            x1 = torch.zeros(16, 1024, length, device=device)
            pe1 = PositionalEncodingPermute1D(1024).to(device)
            wl.impls["positional-encodings (no mask)"] = lambda: _uncached_pe(pe1, x1)
        except ImportError:  # pragma: no cover
            pass
    wls.append(wl)
    return wls


def select(workloads: list[Workload], only: str | None, peers: bool = True) -> list[Workload]:
    """The workloads whose name contains one of the comma-separated words of ``only`` (all
    when None), e.g. ``--only "C5,Deformable"``; ``peers=False`` keeps the floor and vispos'
    rows only (``--no-peers``: a shorter run on a loaded machine)."""
    if not peers:
        for wl in workloads:
            wl.impls = {n: f for n, f in wl.impls.items() if n == FLOOR or n.startswith("vispos")}
    if not only:
        return workloads
    words = [w.strip().lower() for w in only.split(",") if w.strip()]
    return [wl for wl in workloads if any(w in wl.name.lower() for w in words)]


def _inner_calls(fn: Callable[[], object], device: torch.device, target_ms: float = 2.0) -> int:
    """Calls per sample so that one sample of ``fn`` takes about ``target_ms``."""
    ms = min(time_sample(fn, device) for _ in range(3))
    return max(1, min(200, round(target_ms / max(ms, 1e-3))))


def peak_pass(device: torch.device, quick: bool, vispos_only: bool = False, only=None,
              peers: bool = True) -> list[dict[str, int]]:
    """Peak bytes of one call of every implementation (``vispos_only``: the floor and the vispos
    rows, as an A/B run needs); run in a fresh process (see the module doc)."""
    malloc_setup()
    workloads = select(build_workloads(device, quick), only, peers)
    keep = (lambda name: name == FLOOR or name.startswith("vispos")) if vispos_only else (lambda name: True)
    with torch.inference_mode():
        for wl in workloads:  # first calls (lazy imports, module tables) are not the steady state
            wl.prepare(2)
            for name, fn in wl.impls.items():
                if keep(name):
                    fn()
        return [{n: peak_bytes(fn, device) for n, fn in wl.impls.items() if keep(n)} for wl in workloads]


def run(device: torch.device, repeats: int, quick: bool, peaks: list[dict[str, int]] | None = None, only=None,
        workloads: list[Workload] | None = None):
    """Times ``workloads`` (default: the selected ones of :func:`build_workloads`)."""
    if workloads is None:
        workloads = select(build_workloads(device, quick), only)
    timed = []
    with torch.inference_mode():
        for wl in workloads:  # pass 1: steady-state time, default allocator
            names = list(wl.impls)
            wl.prepare(3)
            for name in names:  # warm-up: first-call costs, caches, allocator pools
                for _ in range(3):
                    time_sample(wl.impls[name], device)
            k = _inner_calls(wl.impls[FLOOR], device)
            wl.prepare(repeats * k + 2)  # new batches for every timed call and the two counts
            times: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(repeats):
                for name in names:  # interleaved: A B C A B C ...
                    times[name].append(time_sample(wl.impls[name], device, k))
            ops = {n: count_ops(wl.impls[n])[0] for n in names}  # pass 2: op counts
            for n in wl.device_rows:  # and, for vispos' rows, on the device branch
                ops[n] = (ops[n], count_device_ops(wl.impls[n])[0])
            wl.check_never_hit()
            timed.append((wl, k, times, ops))
    results = []
    for i, (wl, k, times, ops) in enumerate(timed):
        floor = statistics.median(times[FLOOR])
        rows = []
        for name in wl.impls:
            med = statistics.median(times[name])
            peak = peaks[i].get(name, math.nan) if peaks else math.nan
            rows.append((name, med, med / floor, ops[name], peak / 2**20, peak / wl.out_bytes))
        results.append((f"{wl.name} (output {wl.out_bytes / 2**20:.1f} MiB, {k} calls per sample)", rows))
    return results


def format_table(results) -> str:
    lines = []
    for title, rows in results:
        lines.append(f"\n### {title}\n")
        lines.append("| implementation | median ms | x floor | ops / call | device ops | peak MiB | x output |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for name, med, ratio, ops, peak, pratio in rows:
            mem = "- | -" if math.isnan(peak) else f"{peak:.1f} | {pratio:.2f}"  # --no-peak
            host, dev = ops if isinstance(ops, tuple) else (ops, "-")
            lines.append(f"| {name} | {med:.3f} | {ratio:.2f} | {host} | {dev} | {mem} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="half-size workloads (a smoke run)")
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory pass")
    parser.add_argument("--only", metavar="WORDS", help="comma-separated words: the workloads whose name has one")
    parser.add_argument("--no-peers", action="store_true", help="time the floor and vispos' rows only")
    parser.add_argument("--peak-pass", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peak-vispos-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ops-only", action="store_true", help="print the op counts, time nothing")
    parser.add_argument("--ab", metavar="BEFORE", help="A/B: also measure the checkout at BEFORE, interleaved")
    parser.add_argument("--ab-after", metavar="AFTER", help="A/B: the other checkout (default: this one)")
    parser.add_argument("--ab-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device available", file=sys.stderr)
        return 2
    if args.ops_only:
        with torch.inference_mode():
            for wl in select(build_workloads(device, args.quick), args.only, not args.no_peers):
                print(f"\n### {wl.name}\n")
                print("| implementation | ops / call | device ops |\n|---|---:|---:|")
                wl.prepare(3)
                for name, fn in wl.impls.items():
                    fn()  # first calls (lazy imports, module tables) are not the steady state
                    dev = count_device_ops(fn)[0] if name in wl.device_rows else "-"
                    print(f"| {name} | {count_ops(fn)[0]} | {dev} |")
        return 0
    if args.peak_pass:  # the child process of pass 3
        print(json.dumps(peak_pass(device, args.quick, args.peak_vispos_only, args.only, not args.no_peers)))
        return 0
    if args.ab_worker or args.ab:
        import _ab

        if args.ab_worker:
            return _ab.ab_worker(args, sys.modules[__name__])
        _ab.ab_run(args, os.path.abspath(__file__), _ROOT, FLOOR, emit=lambda text: print(text, flush=True))
        return 0
    peaks = None
    if not args.no_peak:  # a fresh process: the timing pass must not run under mallopt
        cmd = [sys.executable, os.path.abspath(__file__), "--peak-pass", "--device", args.device]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--only", args.only] if args.only else []
        cmd += ["--no-peers"] if args.no_peers else []
        cmd += ["--threads", str(args.threads)] if args.threads else []
        peaks = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} CPUs"
    print(
        f"torch {torch.__version__}, device {device} ({name}), threads {torch.get_num_threads()}, "
        f"repeats {args.repeats} (median of interleaved samples)"
    )
    workloads = select(build_workloads(device, args.quick), args.only, not args.no_peers)
    print(format_table(run(device, args.repeats, args.quick, peaks, args.only, workloads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
