"""Stock against padding-invariant backbone: one report over two ablation folders.

Each folder is a ``--report`` folder (``OUT/<arm>/seed<S>/metrics.json``) of runs that differ only
in ``--padding-invariant``. The report gives, on the headline metric (mean of the last three
evaluations) in every evaluation composition the runs recorded (``--eval-batch-sizes``,
``--eval-beside-largest``):

* per arm and seed, the stock and the invariant backbone side by side;
* what padding costs each backbone: composition - alone, paired over seeds;
* what the invariant backbone changes: invariant - stock in each composition, paired over seeds;
* the arms compared within each backbone (sine - grid, sine - none, grid - none), in the demo's
  batches and alone.

Every comparison is read with :func:`vispos.app.train.report.paired` and its rule (an arm is ahead only
when the t-test gives p < 0.05, the bootstrap interval excludes 0 and it wins more seeds than it
loses; otherwise the sentence says level).

    python -m vispos.app.train.compare --stock runs/stock --invariant runs/inv --out compare.md

``--labels A B`` names the two folders' runs otherwise (e.g. two ``--vit-pos`` arms of one
backbone: ``--labels none rope``); the comparisons are the same, B - A.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .report import ALONE, composition_label, load_runs, paired, stats_clause, summarize_compositions

__all__ = ["compare_backbones", "main"]

_ARMS = ("none", "grid", "sine")
_PAIRS = (("sine", "grid"), ("sine", "none"), ("grid", "none"))


def _values(runs: Mapping[str, Mapping[int, Mapping[str, Any]]], metric: str) -> dict[str, dict[int, dict[str, float]]]:
    """``{arm: {seed: {composition: metric (last 3)}}}``."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for arm, by_seed in runs.items():
        for seed, m in by_seed.items():
            comp = summarize_compositions(m, [metric])
            out.setdefault(arm, {})[seed] = {k: v[f"{metric}_last3"] for k, v in comp.items() if f"{metric}_last3" in v}
    return out


def _sentence(label: str, r: Mapping[str, Any], seeds: Sequence[int], x: str, y: str) -> str:
    if len(seeds) < 2:
        return f"- {label}: {len(seeds)} seed(s); too few to compare (difference {r['mean']:+.3f})."
    verdict = {"a ahead": f"**{x} ahead**", "b ahead": f"**{y} ahead**"}.get(r["reading"], "**level**")
    return (f"- {label} over seeds {list(seeds)}: {x} - {y} = {r['mean']:+.3f} ± {r['std']:.3f} "
            f"(per seed {', '.join(f'{d:+.3f}' for d in r['diffs'])}); {x} higher on {r['wins']}, {y} on "
            f"{r['losses']}; {verdict} " + stats_clause(r))


def _compare(a: Mapping[int, Mapping[str, float]], b: Mapping[int, Mapping[str, float]], key_a: str, key_b: str,
             label: str, x: str, y: str) -> str:
    seeds = sorted(s for s in a if s in b and key_a in a[s] and key_b in b[s])
    r = paired([a[s][key_a] for s in seeds], [b[s][key_b] for s in seeds])
    return _sentence(label, r, seeds, x, y)


def compare_backbones(stock_out: str, invariant_out: str, metric: str,
                      labels: Sequence[str] = ("stock", "invariant")) -> str:
    """The markdown report (see the module docstring). ``labels`` name the two folders' runs in it
    (e.g. two position arms of one backbone: ``("none", "rope")``).

    Raises:
        FileNotFoundError: a folder without runs.
        ValueError: ``labels`` not two different names.
    """
    if len(labels) != 2 or labels[0] == labels[1]:
        raise ValueError(f"labels must be two different names, got {list(labels)}")
    sa, ia = labels
    stock = _values(load_runs(stock_out), metric)
    inv = _values(load_runs(invariant_out), metric)
    arms = [a for a in _ARMS if a in stock or a in inv] + sorted((set(stock) | set(inv)) - set(_ARMS))
    keys: list[str] = []
    for by_arm in (stock, inv):
        for by_seed in by_arm.values():
            for comp in by_seed.values():
                keys += [k for k in comp if k not in keys]
    head = keys[0] if keys else ALONE
    lines = [f"Headline metric: {metric}, mean of the last 3 evaluations. Compositions: "
             + ", ".join(composition_label(k) for k in keys) + f" (the demo's headline: {composition_label(head)}).",
             "", "| arm | seed | " + " | ".join(f"{sa} {composition_label(k)}" for k in keys) + " | "
             + " | ".join(f"{ia} {composition_label(k)}" for k in keys) + " |",
             "|---|---:|" + "---:|" * (2 * len(keys))]
    for arm in arms:
        seeds = sorted(set(stock.get(arm, {})) | set(inv.get(arm, {})))
        for seed in seeds:
            cells = []
            for by_arm in (stock, inv):
                comp = by_arm.get(arm, {}).get(seed, {})
                cells += [f"{comp[k]:.3f}" if k in comp else "-" for k in keys]
            lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
        for name, by_arm in ((sa, stock), (ia, inv)):
            per = by_arm.get(arm, {})
            stats = []
            for k in keys:
                vals = [per[s][k] for s in per if k in per[s]]
                stats.append(f"{np.mean(vals):.3f} ± {np.std(vals, ddof=1):.3f}" if len(vals) > 1 else
                             (f"{vals[0]:.3f}" if vals else "-"))
            lines.append(f"| {arm}, {name} mean ± std | | " + (" | ".join(stats) + " | " + " | " * len(keys)
                         if name == sa else " | " * len(keys) + " | ".join(stats) + " |").rstrip())
    lines += ["", "**What padding costs** (the composition against the item alone, same runs):", ""]
    for arm in arms:
        for name, by_arm in ((sa, stock), (ia, inv)):
            for k in keys:
                if k != ALONE and arm in by_arm:
                    lines.append(_compare(by_arm[arm], by_arm[arm], k, ALONE, f"{arm}, {name}: {composition_label(k)} "
                                          f"vs alone", composition_label(k), "alone"))
    what = "the invariant backbone" if ia == "invariant" else ia
    lines += ["", f"**What {what} changes** ({ia} - {sa}, same seed, same composition):", ""]
    for arm in arms:
        if arm in stock and arm in inv:
            for k in keys:
                lines.append(_compare(inv[arm], stock[arm], k, k, f"{arm}, {composition_label(k)}", ia, sa))
    lines += ["", "**The arms within each backbone**:", ""]
    for name, by_arm in ((sa, stock), (ia, inv)):
        for x, y in _PAIRS:
            if x in by_arm and y in by_arm:
                for k in (head, ALONE) if head != ALONE else (head,):
                    lines.append(_compare(by_arm[x], by_arm[y], k, k, f"{name}, {composition_label(k)}: {x} vs {y}",
                                          x, y))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vispos.app.train.compare``: the report on stdout or in ``--out``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stock", required=True, help="folder of the stock backbone's runs")
    p.add_argument("--invariant", required=True, help="folder of the padding-invariant backbone's runs")
    p.add_argument("--labels", nargs=2, default=["stock", "invariant"], metavar=("STOCK", "INVARIANT"),
                   help="names of the two folders' runs in the report (e.g. two --vit-pos arms: none rope)")
    p.add_argument("--metric", default="ap50", help="headline metric (2D: ap50, 3D: ap25)")
    p.add_argument("--out", default=None, help="write the report here")
    args = p.parse_args(argv)
    text = compare_backbones(args.stock, args.invariant, args.metric, args.labels)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
