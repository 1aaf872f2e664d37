"""Seconds per step of the 2D DETR demo: one process against ``torchrun`` with N processes, at
the same global batch.

Runs ``python -m demos.train_detr`` (1 process, batch B, 1 thread and N threads) and
``torchrun --nproc_per_node N -m demos.train_detr`` (N processes, batch B / N each, 1 thread
each) in turn, ``--repeats`` rounds interleaved so that load from other work on the machine hits
every setting alike, and reads the median seconds per step (rank 0, data loading included,
evaluation excluded) from each run's ``metrics.json``. Reports the medians over rounds and the
ratios to the 1-process, 1-thread run.

    python benchmarks/bench_ddp.py --steps 40 --repeats 3 --out benchmarks/results_ddp.md
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(procs: int, threads: int, batch: int, steps: int, out: str) -> float:
    common = ["--steps", str(steps), "--pos", "sine", "--batch-size", str(batch), "--threads", str(threads),
              "--eval-every", str(steps), "--eval-images", "8", "--out", out]
    if procs == 1:
        cmd = [sys.executable, "-m", "demos.train_detr", *common]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
               "--master_port", str(_port()), "-m", "demos.train_detr", *common]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": str(threads)}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    with open(os.path.join(out, "sine", "seed0", "metrics.json")) as f:
        m = json.load(f)
    return float(np.median(m["seconds"][5:]))  # after the first steps' warm-up


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8, help="global batch")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="write the markdown table here")
    args = p.parse_args(argv)
    n = args.procs
    settings = [(1, 1, args.batch), (1, n, args.batch), (n, 1, args.batch // n)]
    times: dict[tuple, list[float]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for s in settings:
                times[s].append(_run(*s, args.steps, os.path.join(tmp, f"{s}-{r}")))
                print(f"round {r}: {s} {times[s][-1]:.3f} s/step", flush=True)
    base = float(np.median(times[settings[0]]))
    lines = [
        f"{args.steps} steps, global batch {args.batch}, default model, {args.repeats} interleaved rounds; "
        "median s/step over steps 6.. of rank 0, then the median over rounds",
        "",
        "| processes x threads | batch per process | s/step (median) | per round | ratio to 1 x 1 |",
        "|---|---|---|---|---|",
    ]
    for procs, threads, batch in settings:
        t = times[(procs, threads, batch)]
        lines.append(f"| {procs} x {threads} | {batch} | {np.median(t):.3f} | {', '.join(f'{x:.3f}' for x in t)} | "
                     f"{np.median(t) / base:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
