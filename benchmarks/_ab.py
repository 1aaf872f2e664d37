"""A/B mode of ``bench_position_embedding.py``: two checkouts measured in one interleaved run.

``python benchmarks/bench_position_embedding.py --ab BEFORE [--ab-after AFTER]`` starts one worker
process per checkout (the benchmark script itself, importing that checkout's ``vispos``), and
alternates every sample between them (the order flips every repeat), so the load of a shared
machine hits both alike. Each row's ratio is taken to its own worker's floor; peers (rows that
do not depend on vispos) run in the "after" worker only; peak memory is measured per checkout
in its own process.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys

import torch

__all__ = ["ab_run", "ab_worker"]


def ab_worker(args, bench) -> int:
    """Serves this process's checkout (``VISPOS_BENCH_ROOT``) to an ``--ab`` parent: JSON lines
    on stdin (one command each) and on the original stdout (one reply each); anything else the
    libraries print goes to stderr. ``bench`` is the benchmark module (its workloads, timers
    and counters)."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    device = torch.device(args.device)
    workloads = bench.select(bench.build_workloads(device, args.quick), getattr(args, "only", None),
                             not getattr(args, "no_peers", False))
    floor = bench.FLOOR

    def reply(value) -> None:
        channel.write(json.dumps(value) + "\n")
        channel.flush()

    reply({"vispos": os.path.dirname(bench.vispos.__file__), "workloads": [
        {"name": wl.name, "out_bytes": wl.out_bytes, "rows": list(wl.impls), "device_rows": wl.device_rows}
        for wl in workloads
    ]})
    with torch.inference_mode():
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            wl = workloads[cmd["wl"]]
            if cmd["op"] == "prepare":
                wl.prepare(cmd["calls"])
                reply(None)
            elif cmd["op"] == "warm":
                for name in cmd["rows"]:
                    for _ in range(3):
                        bench.time_sample(wl.impls[name], device)
                reply(None)
            elif cmd["op"] == "k":
                reply(bench._inner_calls(wl.impls[floor], device))
            elif cmd["op"] == "time":
                reply(bench.time_sample(wl.impls[cmd["row"]], device, cmd["k"]))
            elif cmd["op"] == "ops":
                ops = {}
                for name in cmd["rows"]:
                    dev = bench.count_device_ops(wl.impls[name])[0] if name in wl.device_rows else None
                    ops[name] = [bench.count_ops(wl.impls[name])[0], dev]
                wl.check_never_hit()
                reply(ops)
    return 0


def _command(script: str, args, mode: str) -> list[str]:
    cmd = [sys.executable, script, mode, "--device", args.device]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--only", args.only] if getattr(args, "only", None) else []
    cmd += ["--no-peers"] if getattr(args, "no_peers", False) else []
    return cmd + (["--threads", str(args.threads)] if args.threads else [])


class _Worker:
    """An ``--ab-worker`` subprocess of ``script`` measuring the checkout at ``root``."""

    def __init__(self, script: str, root: str, args) -> None:
        env = dict(os.environ, VISPOS_BENCH_ROOT=root, PYTHONPATH=root)
        cmd = _command(script, args, "--ab-worker")
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"an A/B worker exited (rc {self.proc.wait()}); see its stderr above")
        return json.loads(line)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait()


def _arm_peaks(script: str, root: str, args) -> list[dict[str, int]]:
    env = dict(os.environ, VISPOS_BENCH_ROOT=root, PYTHONPATH=root)
    cmd = _command(script, args, "--peak-pass") + ["--peak-vispos-only"]  # peers: see a plain run
    return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)


def ab_run(args, script: str, root: str, floor_name: str, emit=None) -> str:
    """``--ab BEFORE``: the same workloads on two checkouts (``BEFORE`` and ``--ab-after``, else
    ``root``), each in its own worker process running ``script`` (``floor_name``: its floor
    row); every sample alternates
    between them (the order flips every repeat), so the load of a shared machine hits both
    alike. Rows that do not depend on vispos (the floor excepted) run in the "after" worker
    only. Returns the report (markdown); ``emit`` (optional) is also handed each part as it
    is ready (so a run cut short keeps the workloads it finished)."""
    emit = emit or (lambda text: None)
    roots = {"before": os.path.abspath(args.ab), "after": os.path.abspath(args.ab_after or root)}
    peaks = {arm: None for arm in roots}
    if not args.no_peak:
        peaks = {arm: _arm_peaks(script, path, args) for arm, path in roots.items()}
    workers = {arm: _Worker(script, path, args) for arm, path in roots.items()}
    lines = [
        f"torch {torch.__version__}, device {args.device}, threads {args.threads or torch.get_num_threads()}, "
        f"repeats {args.repeats}; before = {workers['before'].hello['vispos']}, "
        f"after = {workers['after'].hello['vispos']}"
    ]
    emit(lines[0])
    try:
        for i, spec in enumerate(workers["after"].hello["workloads"]):
            rows = {"after": spec["rows"]}
            before = workers["before"].hello["workloads"][i]["rows"]
            rows["before"] = [n for n in before if n == floor_name or n.startswith("vispos")]
            for arm, w in workers.items():
                w.ask(op="prepare", wl=i, calls=3)
                w.ask(op="warm", wl=i, rows=rows[arm])
            k = workers["after"].ask(op="k", wl=i)
            times = {arm: {n: [] for n in rows[arm]} for arm in workers}
            for arm, w in workers.items():
                w.ask(op="prepare", wl=i, calls=args.repeats * k + 2)
            for r in range(args.repeats):
                order = list(workers) if r % 2 == 0 else list(workers)[::-1]
                for name in spec["rows"]:
                    for arm in order:
                        if name in times[arm]:
                            times[arm][name].append(workers[arm].ask(op="time", wl=i, row=name, k=k))
            ops = {arm: w.ask(op="ops", wl=i, rows=rows[arm]) for arm, w in workers.items()}
            peak = {a: p and p[i] for a, p in peaks.items()}
            lines.append(_ab_table(spec, k, times, ops, peak, floor_name))
            emit(lines[-1])
    finally:
        for w in workers.values():
            w.close()
    return "\n".join(lines)


def _ab_table(spec, k, times, ops, peaks, floor_name) -> str:
    out = spec["out_bytes"]
    floor = {arm: statistics.median(t[floor_name]) for arm, t in times.items()}
    low = {arm: min(t[floor_name]) for arm, t in times.items()}  # "min": fastest sample / fastest floor
    lines = [
        f"\n### {spec['name']} (output {out / 2**20:.1f} MiB, {k} calls per sample)\n",
        "| implementation | before ms | x floor | min x floor | after ms | x floor | min x floor | after / before "
        "| ops | device ops | peak x output |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(arm, name, what):
        if name not in times[arm]:
            return None
        if what == "ms":
            return statistics.median(times[arm][name])
        if what == "ops":
            return ops[arm][name]
        return None if peaks[arm] is None else peaks[arm].get(name, math.nan) / out

    def pair(a, b, fmt):
        text = [("-" if v is None else format(v, fmt)) for v in (a, b)]
        return text[1] if a is None or a == b else f"{text[0]} -> {text[1]}"

    for name in spec["rows"]:
        b, a = cell("before", name, "ms"), cell("after", name, "ms")
        ob, oa = cell("before", name, "ops"), cell("after", name, "ops")
        pb, pa = cell("before", name, "peak"), cell("after", name, "peak")
        lo = {arm: min(t[name]) / low[arm] for arm, t in times.items() if name in t}
        first = "- | - | -" if b is None else f"{b:.3f} | {b / floor['before']:.2f} | {lo['before']:.2f}"
        change = "-" if b is None else f"{a / b:.2f}"
        lines.append(
            f"| {name} | {first} | {a:.3f} | {a / floor['after']:.2f} | {lo['after']:.2f} | {change} | "
            f"{pair(ob and ob[0], oa[0], 'd')} | {pair(ob and ob[1], oa[1], 'd') if oa[1] is not None else '-'} | "
            f"{pair(pb, pa, '.2f') if pa is not None else '-'} |"
        )
    return "\n".join(lines)
