"""The loop of a side-by-side benchmark script: peak memory in a fresh process, then timing.

A script builds its workloads (``build(device, quick) -> list[Workload]``, each a floor row and
the implementations to compare, see ``bench_position_embedding.Workload``) and hands them to
:func:`main`, which runs the three passes of ``bench_position_embedding.py``:

1. peak memory of one call of every row, in a fresh process with glibc returning every large
   block (:func:`peak_pass`, ``--peak-pass``; skipped with ``--no-peak``);
2. steady-state time: every row warmed up, then the rows interleaved (A B C A B C ...), one
   sample the mean of ``k`` back-to-back calls (``k`` such that a floor sample takes about
   2 ms), the median over ``--repeats`` samples (:func:`run`);
3. compute ops per call.

Used by ``bench_rope.py`` and ``bench_fourier.py``.
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

import torch

from _measure import count_ops, malloc_setup, peak_bytes, time_sample
from bench_position_embedding import FLOOR, Workload, _inner_calls, format_table

__all__ = ["main", "peak_pass", "run"]

Build = Callable[[torch.device, bool], "list[Workload]"]


def peak_pass(workloads: list[Workload], device: torch.device) -> list[dict[str, int]]:
    """Peak bytes of one call of every row (call it in a fresh process: it sets up glibc)."""
    malloc_setup()
    with torch.inference_mode():
        for wl in workloads:  # first calls (lazy imports, tables) are not the steady state
            for fn in wl.impls.values():
                fn()
        return [{n: peak_bytes(fn, device) for n, fn in wl.impls.items()} for wl in workloads]


def run(workloads: list[Workload], device: torch.device, repeats: int, peaks=None, emit=print) -> list:
    """Times every workload (interleaved, steady state), counts its ops and emits its table."""
    results = []
    with torch.inference_mode():
        for i, wl in enumerate(workloads):
            names = list(wl.impls)
            for name in names:  # warm-up: first calls, allocator pools
                for _ in range(3):
                    time_sample(wl.impls[name], device)
            k = _inner_calls(wl.impls[FLOOR], device)
            times: dict[str, list[float]] = {n: [] for n in names}
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
            emit(format_table(results[-1:]))
    return results


def main(doc: str, script: str, build: Build, argv=None, *, repeats: int = 11, quick_help: str = "") -> int:
    """The command line of a benchmark script (``doc``: its docstring, ``script``: its path)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help=quick_help or "smaller workloads (a smoke run)")
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory pass")
    parser.add_argument("--peak-pass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device available", file=sys.stderr)
        return 2
    if args.peak_pass:  # the child process of the peak pass
        print(json.dumps(peak_pass(build(device, args.quick), device)))
        return 0
    peaks = None
    if not args.no_peak:  # a fresh process: the timing pass must not run under mallopt
        cmd = [sys.executable, os.path.abspath(script), "--peak-pass", "--device", args.device]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--threads", str(args.threads)] if args.threads else []
        peaks = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} CPUs"
    print(f"torch {torch.__version__}, device {device} ({name}), threads {torch.get_num_threads()}, "
          f"repeats {args.repeats} (median of interleaved samples)", flush=True)
    run(build(device, args.quick), device, args.repeats, peaks, emit=lambda text: print(text, flush=True))
    return 0
