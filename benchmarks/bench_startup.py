"""Start-up of the ``vispos`` command against ``import torch``: fresh processes, interleaved.

Run:  python benchmarks/bench_startup.py [--repeats N] [--baseline DIR] [--out FILE.md]

Every row is a fresh ``python`` process (the interpreter running this script), started from an
empty temporary directory outside the checkout with ``PYTHONPATH`` set to the checkout measured,
so its ``vispos`` is the one imported. The rows are run round-robin (one of each, ``--repeats``
times) so a change in the machine's load hits every row alike; the table gives the median wall
time (spawn to exit) and the median peak resident memory (``ru_maxrss`` of that process, from
``wait4``), and their ratios to ``import torch``.

Rows:

* ``python -c pass``: the interpreter alone (the floor of every row);
* ``import torch``: the reference; ``import torch, torchvision, timm``: what building a backbone
  adds (``vispos demo`` / ``run`` import them when their config builds its backbone, as their
  work, and ``vispos plot`` never does);
* ``vispos --help``, ``vispos plot --help``, ``vispos demo --help``, ``vispos config list``:
  the console script's code (``from vispos.app.cli import main; main()``) with those arguments;
* ``vispos plot similarity`` / ``vispos demo`` **up to the point their work starts**:
  ``main()`` with ``load_command`` wrapped so the subcommand's module is imported (with torch and
  all it needs) and its arguments checked, but its ``execute`` is not called;
* ``vispos plot similarity`` whole (imports, figure, PNG) for scale.

``--baseline DIR`` adds the ``--help`` rows and the whole ``plot similarity`` once more against
another checkout (for example ``git archive 06254b6 | tar -x -C /tmp/base``) in the same
round-robin, labelled ``(baseline)`` (an older vispos has neither ``config list`` nor
``load_command``). Targets (issue 32 item 3):
``vispos --help`` at most 0.5 s and 100 MB; a subcommand that needs torch at most 1.3x
``import torch`` before its own work starts. Figures are not tests.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the console script's code (setup.cfg: vispos = vispos.app.cli:main)
_SCRIPT = "import sys; from vispos.app.cli import main; sys.exit(main())"

#: main() up to the subcommand's work: its module imported, its arguments checked, not run
_UNTIL_WORK = (
    "import sys, vispos.app.cli as cli; real = cli.load_command\n"
    "def load(command):\n"
    "    real(command)\n"
    "    return lambda args: None\n"
    "cli.load_command = load\n"
    "sys.exit(cli.main())"
)

#: (label, python arguments, whether a baseline checkout runs the row too: the rows whose
#: arguments and entry point an older vispos also has)
ROWS: list[tuple[str, list[str], bool]] = [
    ("python -c pass", ["-c", "pass"], False),
    ("import torch", ["-c", "import torch"], False),
    ("import torch, torchvision, timm", ["-c", "import torch, torchvision, timm"], False),
    ("vispos --help", ["-c", _SCRIPT, "--help"], True),
    ("vispos plot --help", ["-c", _SCRIPT, "plot", "--help"], True),
    ("vispos demo --help", ["-c", _SCRIPT, "demo", "--help"], True),
    ("vispos config list", ["-c", _SCRIPT, "config", "list"], False),
    ("vispos plot similarity, up to its work", ["-c", _UNTIL_WORK, "plot", "similarity", "--out", "s.png"], False),
    ("vispos demo, up to its work", ["-c", _UNTIL_WORK, "demo", "--out", "demo"], False),
    ("vispos plot similarity, whole", ["-c", _SCRIPT, "plot", "similarity", "--dpi", "60", "--out", "s.png"], True),
]


def measure(argv: list[str], root: str, cwd: str) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MiB) and exit status of one fresh ``python argv`` process."""
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return wall, usage.ru_maxrss / 1024, proc.returncode


def _commit(root: str) -> str:
    try:
        out = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return f"commit {out}" + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout)"


def run(repeats: int, baseline: str | None) -> tuple[list[dict], list[float]]:
    """Runs every row ``repeats`` times round-robin; returns one summary per row and the load
    averages seen (before, after)."""
    plan = [(label, argv, ROOT) for label, argv, _ in ROWS]
    if baseline:
        plan += [(f"{label} (baseline)", argv, baseline) for label, argv, twin in ROWS if twin]
    samples: dict[str, list[tuple[float, float, int]]] = {label: [] for label, _, _ in plan}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="vispos-startup-") as cwd:
        for r in range(repeats):
            for label, argv, root in plan:
                samples[label].append(measure(argv, root, cwd))
            print(f"round {r + 1}/{repeats} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    rows = []
    for label, _, _ in plan:
        walls, rss, codes = zip(*samples[label])
        rows.append({"label": label, "wall": statistics.median(walls), "rss": statistics.median(rss),
                     "min_wall": min(walls), "codes": sorted(set(codes))})
    return rows, load


def format_table(rows: list[dict]) -> str:
    ref = next(r for r in rows if r["label"] == "import torch")
    lines = ["| command | median wall (s) | fastest (s) | peak RSS (MB) | time / import torch | RSS / import torch | exit |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['wall']:.2f} | {r['min_wall']:.2f} | {r['rss']:.0f} | "
                     f"{r['wall'] / ref['wall']:.2f} | {r['rss'] / ref['rss']:.2f} | "
                     f"{','.join(map(str, r['codes']))} |")
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    """Issue 32 item 3's targets, each with the figure measured and met / not met."""
    by = {r["label"]: r for r in rows}
    torch_row = by["import torch"]
    out = []
    for label in ("vispos --help", "vispos plot --help", "vispos demo --help"):
        r = by[label]
        ok = r["wall"] <= 0.5 and r["rss"] <= 100
        out.append(f"- `{label}`: {r['wall']:.2f} s, {r['rss']:.0f} MB (target at most 0.5 s and 100 MB): "
                   f"{'met' if ok else 'NOT met'}")
    for label in ("vispos plot similarity, up to its work", "vispos demo, up to its work"):
        r = by[label]
        t, m = r["wall"] / torch_row["wall"], r["rss"] / torch_row["rss"]
        out.append(f"- {label}: {t:.2f}x the time and {m:.2f}x the memory of `import torch` (target at "
                   f"most 1.3x): {'met' if t <= 1.3 and m <= 1.3 else 'NOT met'}")
    return out


def report(rows: list[dict], load: list[float], repeats: int, baseline: str | None) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("torch", "torchvision", "timm"))
    head = [
        "# Start-up of the vispos command",
        "",
        f"`python benchmarks/bench_startup.py --repeats {repeats}"
        + (" --baseline DIR" if baseline else "") + f"` on {_commit(ROOT)}, {when}.",
        f"Python {platform.python_version()}, {versions}; {os.cpu_count()} CPUs; load average "
        f"{load[0]:.1f} before, {load[1]:.1f} after. Each row is a fresh process started from an empty "
        "directory outside the checkout; rows run round-robin; medians of "
        f"{repeats} runs (MB = MiB of peak resident memory).",
    ]
    if baseline:
        head.append(f"Baseline rows run the checkout at `{baseline}` ({_commit(baseline)}).")
    return "\n".join([*head, "", format_table(rows), "", "Targets (issue 32 item 3):", "", *verdicts(rows), ""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of each row (median reported)")
    parser.add_argument("--baseline", help="another checkout whose vispos rows run alongside")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results_startup.md"),
                        help="the Markdown file written (default: benchmarks/results_startup.md)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    baseline = os.path.abspath(args.baseline) if args.baseline else None
    if baseline and not os.path.isfile(os.path.join(baseline, "vispos", "__init__.py")):
        parser.error(f"--baseline {args.baseline!r} is not a vispos checkout (no vispos/__init__.py)")
    rows, load = run(args.repeats, baseline)
    text = report(rows, load, args.repeats, baseline)
    print(text)
    with open(args.out, "w") as fh:
        fh.write(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
