"""The three 3D segmentation pipelines side by side: seconds per training step, seconds per
held-out volume of inference, and peak inference memory, in one process on one thread.

Builds ``vispos train --volume --task segment``'s pipelines (``crop``, ``whole``, ``invariant``)
with the app's own functions (:func:`~vispos.app.train.segment3d.build_datasets`,
:func:`~vispos.app.train.segment3d.build_network`, :class:`~vispos.app.train.segment3d.Segmenter`,
its loss, optimiser and schedule, :func:`~vispos.app.train.segment3d_eval.infer` and
:func:`~vispos.app.train.segment3d_eval.composition_batches`) at the task's defaults, or at the
app flags given after ``--``. Then:

1. **Training**: steps interleaved round-robin (crop, whole, invariant, repeat), each pipeline's
   step ``s`` on the same training volumes (crop: MONAI's patches of them). A step is what the
   app's loop times less the data: collate, forward, the loss on each volume's own voxels,
   backward, gradient clipping, AdamW and the schedule. The data (building the step's items)
   is timed beside it. The first ``--warmup`` rounds are not kept.
2. **Inference** over the held-out volumes, one pass per row and round, rows interleaved: crop by
   ``sliding_window_inference`` on each volume alone (as the app infers), whole and invariant
   alone and in padded batches of 4. Seconds per volume of one pass; the first
   ``--infer-warmup`` rounds are not kept.
3. **Peak inference memory** (``--no-peak`` skips it): one fresh process per pipeline, glibc
   set to return every block over 128 KiB to the system (``_measure.malloc_setup``), so the
   resident set follows live memory; for each batch of the held-out set ``_measure.peak_bytes``
   resets the high-water mark (``/proc/self/clear_refs``) and reads ``VmHWM`` above the RSS
   before the call, logits included; the row's peak is the largest over the batches, one
   untimed batch first.

Wall time is what a loop sees; CPU time (``time.process_time``, one thread) is close to the wall
time of a quiet machine. Ratios are taken round by round (a step or pass of each pipeline from
the same round), so load from other processes falls on both sides of a ratio alike.

    python benchmarks/bench_segment3d.py --out benchmarks/results_segment3d.md
    python benchmarks/bench_segment3d.py --quick                        # a smoke run (--tiny data)
    python benchmarks/bench_segment3d.py --steps 20 -- --sizes 48 96    # other app flags
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vispos  # noqa: E402
from _measure import malloc_setup, peak_bytes  # noqa: E402
from vispos.app._flags import torch_threads  # noqa: E402
from vispos.app.train.engine import WarmupStepDecay  # noqa: E402
from vispos.app.train.segment3d import Segmenter, build_datasets, build_network, train_step  # noqa: E402
from vispos.app.train.segment3d_args import PIPELINES, parse_segment_flags  # noqa: E402
from vispos.app.train.segment3d_eval import ALONE, composition_batches, infer  # noqa: E402

BATCH4 = "batch4"
#: the inference rows, in their interleaved order: (pipeline, composition)
INFER_ROWS = (("crop", ALONE), ("whole", ALONE), ("whole", BATCH4), ("invariant", ALONE), ("invariant", BATCH4))
#: the ratios reported: (numerator, denominator) pipelines
RATIOS = (("whole", "crop"), ("invariant", "whole"), ("invariant", "crop"))
CPU = torch.device("cpu")


class Pipeline:
    """One pipeline as ``vispos.app.train.segment3d.train_run`` builds it (flags parsed by the
    app's parser, so the defaults are the task's), its data fetched in step order."""

    def __init__(self, name: str, app_argv: Sequence[str], steps: int) -> None:
        from monai.losses import DiceCELoss

        _, args = parse_segment_flags(["--volume", "--pipeline", name, *app_argv])
        args.train_images = steps * args.batch_size  # a fresh volume for every sample, as the app's default
        self.name, self.args = name, args
        self.train, self.held = build_datasets(args)
        self.model = Segmenter(build_network(args), name, args.patch, args.network)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, WarmupStepDecay(args.warmup, args.steps))
        self.loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
        self.collate = vispos.PaddedCollate()  # the app's DataLoader collate

    def items(self, step: int) -> list:
        """The items of training step ``step`` (items ``step * B .. step * B + B - 1``)."""
        b = self.args.batch_size
        return [self.train[step * b + i] for i in range(b)]

    def step(self, items: list) -> vispos.NestedTensor:
        """One optimiser step, as the app's training loop takes it; returns the padded batch."""
        nested, targets = self.collate(items)
        loss = train_step(self.model, nested, targets, self.loss_fn, self.optim, self.sched, self.args.clip)
        float(loss)  # the app reads the loss every step
        return nested


def held_out(pipe: Pipeline) -> tuple[list[torch.Tensor], dict[str, list]]:
    """The held-out volumes (fixed per seed, the same in every pipeline) and their batches."""
    images = [pipe.held[i][0] for i in range(len(pipe.held))]
    sizes = [img.shape[1:] for img in images]
    return images, composition_batches(sizes, [ALONE, BATCH4])


def timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    """``(wall seconds, CPU seconds of this process, fn's result)`` of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def train_rounds(pipes: dict[str, Pipeline], steps: int, warmup: int) -> dict:
    """Training steps, round-robin over ``pipes``; ``{pipeline: {"wall", "cpu", "data"}: [s]}``
    for the rounds after ``warmup``, and the padded share of the whole-volume batches."""
    out = {name: {"wall": [], "cpu": [], "data": []} for name in pipes}
    padded = []
    for step in range(warmup + steps):
        for name, pipe in pipes.items():
            data, _, items = timed(lambda: pipe.items(step))
            wall, cpu, nested = timed(lambda: pipe.step(items))
            if step >= warmup:
                out[name]["wall"].append(wall)
                out[name]["cpu"].append(cpu)
                out[name]["data"].append(data)
                if name == "whole":
                    padded.append(float(nested.mask.float().mean()))
    out["padded_fraction"] = float(np.mean(padded)) if padded else 0.0
    return out


def infer_rounds(pipes: dict[str, Pipeline], images, batches, rounds: int, warmup: int) -> dict:
    """Inference passes over the held-out set, the rows of :data:`INFER_ROWS` round-robin;
    ``{(pipeline, composition): {"wall", "cpu"}: [s per volume]}`` after ``warmup`` rounds,
    and each pipeline's largest logit difference between its compositions (first round)."""
    for pipe in pipes.values():
        pipe.model.eval()
    out = {row: {"wall": [], "cpu": []} for row in INFER_ROWS}
    logits = {}
    for r in range(warmup + rounds):
        for name, key in INFER_ROWS:
            wall, cpu, (found, _) = timed(lambda: infer(pipes[name].model, images, batches[key], CPU))
            if r == 0:
                logits[name, key] = found
            if r >= warmup:
                out[name, key]["wall"].append(wall / len(images))
                out[name, key]["cpu"].append(cpu / len(images))
    out["logit_diff"] = {
        name: max(float((logits[name, BATCH4][i] - logits[name, ALONE][i]).abs().max()) for i in range(len(images)))
        for name in ("whole", "invariant")}
    return out


def peak_pass(name: str, app_argv: Sequence[str], passes: int) -> dict[str, list[int]]:
    """In a fresh process: ``{composition: [peak bytes of each pass]}`` of ``name``'s inference
    (the largest over the held-out batches of a pass; see the module docstring)."""
    malloc_setup()
    pipe = Pipeline(name, app_argv, steps=1)
    pipe.model.eval()
    images, batches = held_out(pipe)
    out = {}
    for key in [k for n, k in INFER_ROWS if n == name]:
        infer(pipe.model, images, batches[key][:1], CPU)  # first calls: lazy imports, tables
        out[key] = [max(peak_bytes(lambda b=b: infer(pipe.model, images, [b], CPU), CPU) for b in batches[key])
                    for _ in range(passes)]
    return out


def peaks_in_subprocesses(args, app_argv: Sequence[str]) -> dict:
    """:func:`peak_pass` of every pipeline, each in its own process; ``{(pipeline, key): [bytes]}``."""
    found = {}
    for name in PIPELINES:
        cmd = [sys.executable, os.path.abspath(__file__), "--peak-pass", name, "--threads", str(args.threads),
               "--peak-passes", str(args.peak_passes), "--", *app_argv]
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        for key, values in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            found[name, key] = values
    return found


# ---------------------------------------------------------------------------------------- report
def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(med), float(q1), float(q3)


def _cell(values: Sequence[float], fmt: str = ".3f") -> str:
    """``median [Q1, Q3]``."""
    med, q1, q3 = _quartiles(values)
    return f"{med:{fmt}} [{q1:{fmt}}, {q3:{fmt}}]"


def _paired(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Round-by-round ratios ``a[r] / b[r]``."""
    return [x / y for x, y in zip(a, b)]


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:  # pragma: no cover - not Linux
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def _commit() -> str:
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    notes = [what for what, path in (("vispos/ has uncommitted changes", "vispos"),
                                     ("this script is uncommitted or changed", "benchmarks/bench_segment3d.py"))
             if git("status", "--porcelain", "--", path)]
    return head + (f" ({'; '.join(notes)})" if notes else "")


def report(meta: dict, train: dict, inference: dict, peaks: dict | None) -> str:
    """The markdown report of one run."""
    a = meta["app"]
    load0, load1 = meta["load_before"], meta["load_after"]
    lines = [
        "# 3D segmentation pipelines: training step, inference and memory, interleaved (CPU)", "",
        f"`{meta['command']}`", "",
        f"- machine: {_machine()}; load average (1, 5, 15 min) {load0[0]:.2f}, {load0[1]:.2f}, {load0[2]:.2f} "
        f"before and {load1[0]:.2f}, {load1[1]:.2f}, {load1[2]:.2f} after the run",
        f"- torch {torch.__version__}, MONAI {meta['monai']}, {torch.get_num_threads()} thread(s); commit "
        f"{meta['commit']}; {meta['seconds']:.0f} s in all",
        f"- the app's settings: {a.network} (features {a.features}), batch {a.batch_size}, volume sides "
        f"{a.sizes[0]}-{a.sizes[1]} voxels (multiples of 8), spacings {a.spacings[0]:g}-{a.spacings[1]:g} mm, "
        f"crop patch {a.patch}; {100 * train['padded_fraction']:.0f} % of the voxels of the whole-volume "
        f"training batches are padding; {meta['held']} held-out volumes ({meta['held_voxels']})",
        f"- training: {meta['steps']} timed steps per pipeline after {meta['warmup']} untimed, round-robin "
        f"(crop, whole, invariant); inference: {meta['rounds']} timed passes over the held-out set per row "
        f"after {meta['infer_warmup']} untimed, rows round-robin",
        "- cells: median [first quartile, third quartile]; ratios are taken round by round and then summarised",
        "",
        "## Training step (seconds)", "",
        "| pipeline | wall s/step | CPU s/step | data s/step (building the items, wall) |",
        "|---|---:|---:|---:|",
    ]
    for name in PIPELINES:
        t = train[name]
        lines.append(f"| {name} | {_cell(t['wall'])} | {_cell(t['cpu'])} | {_cell(t['data'])} |")
    lines += ["", "## Inference (seconds per held-out volume)", "",
              "| pipeline | composition | wall s/volume | CPU s/volume | peak MiB above the RSS before |",
              "|---|---|---:|---:|---:|"]
    for name, key in INFER_ROWS:
        row = inference[name, key]
        how = "sliding window, alone" if name == "crop" else ("alone" if key == ALONE else "padded batches of 4")
        peak = "-" if peaks is None else " / ".join(f"{b / 2**20:.0f}" for b in peaks[name, key])
        lines.append(f"| {name} | {how} | {_cell(row['wall'])} | {_cell(row['cpu'])} | {peak} |")
    lines += ["", "## Ratios", "",
              "| ratio | training step, wall | training step, CPU | inference alone, wall | inference alone, CPU "
              "| inference batch 4, wall | inference batch 4, CPU | peak memory alone | peak memory batch 4 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for num, den in RATIOS:
        cells = [_cell(_paired(train[num][c], train[den][c]), ".2f") for c in ("wall", "cpu")]
        for key in (ALONE, BATCH4):  # crop has only the sliding window alone
            n_row, d_row = inference[num, key], inference[den, ALONE if den == "crop" else key]
            cells += [_cell(_paired(n_row[c], d_row[c]), ".2f") for c in ("wall", "cpu")]
        for key in (ALONE, BATCH4):
            if peaks is None:
                cells.append("-")
            else:
                cells.append(f"{max(peaks[num, key]) / max(peaks[den, ALONE if den == 'crop' else key]):.2f}")
        lines.append(f"| {num} / {den} | " + " | ".join(cells) + " |")
    diff = inference["logit_diff"]
    lines += ["", "In the batch-4 columns a ratio to crop is to its sliding window alone (it has no batch). "
              "Largest logit difference of a held-out volume between batches of 4 and alone (first round): "
              f"whole {diff['whole']:.2e}, invariant {diff['invariant']:.2e}.", ""]
    if peaks is not None:
        lines += [
            f"Peak memory: per pipeline a fresh process; {meta['peak_passes']} pass(es) over the held-out set "
            "(shown as pass 1 / pass 2 ...), each the largest over its batches of the resident high-water "
            "mark (`VmHWM`, reset through `/proc/self/clear_refs` before each batch) above the RSS before it, "
            "with glibc returning every block over 128 KiB to the system (`benchmarks/_measure.py`: "
            "`malloc_setup`, `peak_bytes`). Ratios use the largest pass.", ""]
    return "\n".join(lines)


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    own, app = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="timed training steps per pipeline")
    p.add_argument("--warmup", type=int, default=3, help="untimed training rounds first")
    p.add_argument("--rounds", type=int, default=8, help="timed inference passes per row")
    p.add_argument("--infer-warmup", type=int, default=1, help="untimed inference rounds first")
    p.add_argument("--peak-passes", type=int, default=2, help="measured passes of the peak-memory process")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: the app's --tiny data and network, 2 steps, 1 pass of each kind")
    p.add_argument("--no-peak", action="store_true", help="skip the peak-memory processes")
    p.add_argument("--out", default=None, help="write the markdown report to this file")
    p.add_argument("--peak-pass", choices=PIPELINES, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(own)
    for flag in ("steps", "rounds", "peak_passes", "threads"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("warmup", "infer_warmup"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    if args.quick:
        args.steps, args.warmup, args.rounds, args.infer_warmup, args.peak_passes = 2, 1, 1, 1, 1
        app = ["--tiny", *app]
    return args, app


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, app = _parse(argv)
    with torch_threads(args.threads):
        if args.peak_pass:  # the child process of the peak-memory pass
            print(json.dumps(peak_pass(args.peak_pass, app, args.peak_passes)))
            return 0
        return _run(args, app, argv)


def _run(args: argparse.Namespace, app: list[str], argv: list[str]) -> int:
    import monai

    t_start, load_before, commit = time.perf_counter(), os.getloadavg(), _commit()  # the code as imported

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f} s] {what}", file=sys.stderr, flush=True)

    progress("peak memory, one process per pipeline" if not args.no_peak else "building")
    peaks = None if args.no_peak else peaks_in_subprocesses(args, app)
    pipes = {name: Pipeline(name, app, steps=args.warmup + args.steps) for name in PIPELINES}
    images, batches = held_out(pipes["whole"])
    progress(f"training steps, {args.warmup} + {args.steps} rounds")
    train = train_rounds(pipes, args.steps, args.warmup)
    progress(f"inference, {args.infer_warmup} + {args.rounds} rounds")
    inference = infer_rounds(pipes, images, batches, args.rounds, args.infer_warmup)
    progress("done")
    held_sizes = ["x".join(map(str, img.shape[1:])) for img in images]
    meta = {
        "command": "python benchmarks/bench_segment3d.py " + " ".join(argv), "monai": monai.__version__,
        "load_before": load_before, "load_after": os.getloadavg(), "commit": commit,
        "seconds": time.perf_counter() - t_start, "app": pipes["whole"].args, "held": len(images),
        "held_voxels": ", ".join(held_sizes), "steps": args.steps, "warmup": args.warmup,
        "rounds": args.rounds, "infer_warmup": args.infer_warmup, "peak_passes": args.peak_passes,
    }
    text = report(meta, train, inference, peaks)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
