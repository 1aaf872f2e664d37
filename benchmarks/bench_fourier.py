"""Random Fourier features and the RT-DETR table side by side: vispos against segment_anything,
transformers and MONAI, steady state.

Run:  python benchmarks/bench_fourier.py [--device cpu|cuda] [--repeats N] [--threads T] [--no-peak]

The harness of ``bench_position_embedding.py`` (same three passes: interleaved steady-state
medians of ``k`` back-to-back calls, compute ops per call, peak memory of one call in a fresh
process with glibc returning every large block), on these workloads:

* SAM's dense grid, 64 x 64, 256 channels (``get_dense_pe``): segment_anything's
  ``PositionEmbeddingRandom((64, 64))``, transformers' ``SamModel.get_image_wide_positional_embeddings``
  (its grid through ``SamPositionalEmbedding``) and vispos' ``PositionEmbeddingRandom((64, 64))``;
* a padded batch of 8 on the 64 x 64 canvas (SAM's resize-longest-side sizes): SAM's canvas
  repeated over the batch (what transformers' ``SamModel`` does) against vispos'
  ``normalize="canvas"``; SAM run per item at the item's size and pasted into a zero canvas
  against vispos' ``normalize="item"``;
* a 3D grid, 32^3 tokens, 768 channels: MONAI's ``build_fourier_position_embedding`` (it draws
  its matrix: 384 x 3 normal numbers) against ``vispos.monai_fourier`` (the same) and the module
  with MONAI's arguments (matrix drawn once);
* the RT-DETR table, 20 x 20 and 40 x 40 at 256 channels: transformers'
  ``build_2d_sinusoidal_position_embedding`` (uncached) against ``vispos.rtdetr_sincos_2d``.

The floor is writing the output once (``empty().fill_()``). Timings are not tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _measure import count_ops, malloc_setup, peak_bytes, time_sample  # noqa: E402
from bench_position_embedding import FLOOR, Workload, _inner_calls, format_table  # noqa: E402

import vispos  # noqa: E402

#: SAM's items on its 64 x 64 embedding grid (longest side resized to 1024 px, stride 16)
SAM_ITEMS = [(64, 64), (43, 64), (64, 48), (48, 64), (64, 43), (56, 64), (64, 64), (36, 64)]


def _fill(shapes, device):
    def run():
        return [torch.empty(s, device=device).fill_(1.0) for s in shapes]

    return run


def _sam_workloads(device: torch.device) -> list[Workload]:
    from segment_anything.modeling.prompt_encoder import PositionEmbeddingRandom as SamRandom
    from transformers.models.sam.configuration_sam import SamVisionConfig
    from transformers.models.sam.modeling_sam import SamPositionalEmbedding as HFSam

    torch.manual_seed(0)
    sam = SamRandom(128).to(device)
    ours = vispos.PositionEmbeddingRandom.from_module(sam).to(device)
    item = vispos.PositionEmbeddingRandom.from_module(sam, normalize="item").to(device)
    hf = HFSam(SamVisionConfig(num_pos_feats=128)).to(device)
    hf.positional_embedding.data.copy_(sam.positional_encoding_gaussian_matrix)

    def hf_dense(size=64):  # SamModel.get_image_wide_positional_embeddings, verbatim
        grid = torch.ones((size, size), device=device, dtype=torch.float32)
        y_embed = (grid.cumsum(dim=0) - 0.5) / size
        x_embed = (grid.cumsum(dim=1) - 0.5) / size
        return hf(torch.stack([x_embed, y_embed], dim=-1)).permute(2, 0, 1).unsqueeze(0)

    wls = []
    wl = Workload("SAM dense grid: 64x64, 256 ch", 256 * 64 * 64 * 4)
    wl.impls[FLOOR] = _fill([(256, 64, 64)], device)
    wl.impls["segment_anything PositionEmbeddingRandom"] = lambda: sam((64, 64))
    wl.impls["transformers SamModel grid"] = hf_dense
    wl.impls["vispos PositionEmbeddingRandom"] = lambda: ours((64, 64))
    wls.append(wl)

    batch = len(SAM_ITEMS)
    nested = vispos.nested_tensor_from_tensor_list([torch.zeros(1, *s) for s in SAM_ITEMS]).to(device)

    def sam_per_item():
        canvas = torch.zeros(batch, 256, 64, 64, device=device)
        for b, (h, w) in enumerate(SAM_ITEMS):
            canvas[b, :, :h, :w] = sam((h, w))
        return canvas

    wl = Workload(f"SAM padded batch: {batch} items on a 64x64 canvas, 256 ch", batch * 256 * 64 * 64 * 4)
    wl.impls[FLOOR] = _fill([(batch, 256, 64, 64)], device)
    wl.impls["segment_anything canvas, repeated (as SamModel)"] = lambda: sam((64, 64)).unsqueeze(0).repeat(batch, 1, 1, 1)
    wl.impls["vispos normalize='canvas'"] = lambda: ours(nested)
    wl.impls["segment_anything per item, pasted"] = sam_per_item
    wl.impls["vispos normalize='item'"] = lambda: item(nested)
    wls.append(wl)
    return wls


def _monai_workload(device: torch.device) -> Workload:
    from monai.networks.blocks.pos_embed_utils import build_fourier_position_embedding

    side, dim = 32, 768
    module = vispos.PositionEmbeddingRandom(
        dim // 2, num_axes=3, coord_order="ij", align_corners=True, coord_range=(0.0, 1.0)
    ).to(device)
    wl = Workload(f"3D grid: {side}^3 tokens, {dim} ch (MONAI Fourier)", side**3 * dim * 4)
    wl.impls[FLOOR] = _fill([(1, side**3, dim)], device)
    if device.type == "cpu":  # MONAI builds on the CPU
        wl.impls["MONAI build_fourier_position_embedding"] = lambda: build_fourier_position_embedding(side, dim, 3)
    wl.impls["vispos monai_fourier"] = lambda: vispos.monai_fourier(side, dim, 3, device=device)
    wl.impls["vispos PositionEmbeddingRandom (MONAI's arguments)"] = lambda: module((side,) * 3)
    return wl


def _rtdetr_workloads(device: torch.device) -> list[Workload]:
    from transformers.models.rt_detr.modeling_rt_detr import build_2d_sinusoidal_position_embedding

    wls = []
    for side in (20, 40):
        wl = Workload(f"RT-DETR table: {side}x{side}, 256 ch", side * side * 256 * 4)
        wl.impls[FLOOR] = _fill([(side * side, 256)], device)
        wl.impls["transformers build_2d_sinusoidal_position_embedding"] = (
            lambda side=side: build_2d_sinusoidal_position_embedding(side, side, 256, 10000.0, device=device)
        )
        wl.impls["vispos rtdetr_sincos_2d"] = lambda side=side: vispos.rtdetr_sincos_2d(side, side, 256, device=device)
        wls.append(wl)
    return wls


def build_workloads(device: torch.device) -> list[Workload]:
    return _sam_workloads(device) + [_monai_workload(device)] + _rtdetr_workloads(device)


def peak_pass(device: torch.device) -> list[dict[str, int]]:
    """Peak bytes of one call of every implementation (run in a fresh process)."""
    malloc_setup()
    workloads = build_workloads(device)
    with torch.inference_mode():
        for wl in workloads:
            for fn in wl.impls.values():
                fn()
        return [{n: peak_bytes(fn, device) for n, fn in wl.impls.items()} for wl in workloads]


def run(device: torch.device, repeats: int, peaks=None) -> list:
    results = []
    with torch.inference_mode():
        for i, wl in enumerate(build_workloads(device)):
            names = list(wl.impls)
            for name in names:  # warm-up: first calls, allocator pools
                for _ in range(3):
                    time_sample(wl.impls[name], device)
            k = _inner_calls(wl.impls[FLOOR], device)
            times = {n: [] for n in names}
            for _ in range(repeats):
                for name in names:  # interleaved: A B C A B C ...
                    times[name].append(time_sample(wl.impls[name], device, k))
            ops = {n: count_ops(wl.impls[n])[0] for n in names}
            floor = statistics.median(times[FLOOR])
            rows = []
            for name in names:
                med = statistics.median(times[name])
                peak = peaks[i].get(name, math.nan) if peaks else math.nan
                rows.append((name, med, med / floor, ops[name], peak / 2**20, peak / wl.out_bytes))
            results.append((f"{wl.name} (output {wl.out_bytes / 2**20:.1f} MiB, {k} calls per sample)", rows))
            print(format_table(results[-1:]), flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory pass")
    parser.add_argument("--peak-pass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device available", file=sys.stderr)
        return 2
    if args.peak_pass:
        print(json.dumps(peak_pass(device)))
        return 0
    peaks = None
    if not args.no_peak:  # a fresh process: the timing pass must not run under mallopt
        cmd = [sys.executable, os.path.abspath(__file__), "--peak-pass", "--device", args.device]
        cmd += ["--threads", str(args.threads)] if args.threads else []
        peaks = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} CPUs"
    print(f"torch {torch.__version__}, device {device} ({name}), threads {torch.get_num_threads()}, "
          f"repeats {args.repeats} (median of interleaved samples)")
    run(device, args.repeats, peaks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
