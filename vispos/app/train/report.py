"""The ablation report of the demos: tables over seeds and the curves, from ``metrics.json`` files.

Runs may come from separate processes (one per arm and seed, two at a time): :func:`load_runs`
finds every ``OUT/<arm>/seed<S>/metrics.json`` and the report is rebuilt from those files alone
(``--report``). Held-out numbers are read at the last evaluation and as the mean of the last
three evaluations ("last 3", less noisy); the paired comparison of two arms uses the per-seed
differences of the last-3 values, with a two-sided sign test and a percentile bootstrap interval
of the mean difference.

References:
    Dixon & Mood, The statistical sign test, JASA 1946; Efron & Tibshirani, An Introduction to
    the Bootstrap, 1993 (percentile interval).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["load_runs", "summarize", "summarize_compositions", "composition_label", "paired", "stats_clause", "ablation_table",
           "plot_curves", "TINY_NOTE", "tiny_summary"]

ARM_LABELS = {"none": "(a) none", "grid": "(b) grid, mask-blind", "sine": "(c) sine, mask-aware"}
#: settings that may differ between the runs of one report
_FREE = {"seed", "threads", "workers", "out", "report", "resume", "force", "save_every", "device", "eval_every",
         "eval_batch_sizes", "eval_beside_largest"}
#: the composition in which an item is alone
ALONE = "batch1"
#: what a ``--tiny`` run can and cannot show, in one line: ``{steps}`` its number of steps,
#: ``{metric}`` the held-out metric, ``{compared}`` what a full run compares (arm, pipeline),
#: ``{full_steps}`` and ``{doc}`` a full run's default steps and the page that documents it
TINY_NOTE = ("tiny run: {steps} steps show that training runs end to end and whether the loss falls, not "
             "accuracy (held-out {metric} stays near 0 this early) nor which {compared} is better; for those, "
             "train without --tiny ({full_steps} steps, several seeds: {doc})")


def load_runs(out: str, arms: Sequence[str] | None = None) -> dict[str, dict[int, dict[str, Any]]]:
    """``{arm: {seed: metrics}}`` from ``out/<arm>/seed*/metrics.json``.

    Args:
        out (str): the output folder.
        arms (sequence of str, optional): only these arms (each must have a run). None (the
            default, what ``--report`` does): every arm with at least one finished run under
            ``out``, in the order of :data:`ARM_LABELS`, then any other arm by name. Runs still
            in flight have no ``metrics.json`` yet and are not counted.

    Raises:
        FileNotFoundError: no run under ``out`` (or none of a requested arm).
    """
    found = sorted(glob.glob(os.path.join(glob.escape(out), "*", "seed*", "metrics.json")))
    present = {os.path.basename(os.path.dirname(os.path.dirname(p))) for p in found}
    if arms is None:
        arms = [a for a in ARM_LABELS if a in present] + sorted(present - set(ARM_LABELS))
        if not arms:
            raise FileNotFoundError(f"no run under {out!r} (expected {out}/<arm>/seed<S>/metrics.json)")
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for arm in arms:
        runs[arm] = {}
        for path in sorted(glob.glob(os.path.join(glob.escape(out), glob.escape(arm), "seed*", "metrics.json"))):
            with open(path) as f:
                m = json.load(f)
            runs[arm][int(m["seed"])] = m
        if not runs[arm]:
            raise FileNotFoundError(f"no run of arm {arm!r} under {out!r} ({out}/{arm}/seed*/metrics.json)")
    return runs


def summarize(m: Mapping[str, Any], names: Sequence[str], memory_warmup: int) -> dict[str, float]:
    """One run's numbers: every held-out metric at the last evaluation and as the mean of the last
    three (``<name>_last3``), the final train loss (mean of the last tenth of the steps, last
    decoder layer), median seconds per step and resident memory after ``memory_warmup`` steps
    and at the end."""
    evals = m["eval"]
    out: dict[str, float] = {}
    for name in ("mean_iou", *names):
        values = [e[name] for e in evals]
        out[name] = values[-1]
        out[f"{name}_last3"] = float(np.mean(values[-3:]))
    rss = m["rss_mb"]
    w = min(memory_warmup, len(rss) - 1)
    out.update(
        final_loss=float(np.mean(m["loss_last"][-max(1, len(rss) // 10):])),
        s_per_step=float(np.median(m["seconds"][1:] or m["seconds"])),
        rss_warm_mb=rss[w], rss_end_mb=rss[-1], rss_growth_pct=100 * (rss[-1] / rss[w] - 1),
    )
    return out


def composition_label(key: str) -> str:
    """``"batch8"`` -> ``"batch 8"``, ``"beside_largest"`` -> ``"beside the largest"`` (keys of
    :mod:`vispos.app.train.heldout`)."""
    if key == "beside_largest":
        return "beside the largest"
    return "batch " + key.removeprefix("batch") if key.startswith("batch") else key


def _at(key: str) -> str:
    label = composition_label(key)
    return label if key == "beside_largest" else f"at {label}"


def summarize_compositions(m: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """One run's held-out metrics in every evaluation composition it recorded
    (``m["eval_by_composition"]``, the last three evaluations): ``{key: {name: final value,
    "<name>_last3": mean of the last three}}``, in the order of ``m["eval_compositions"]``
    (the headline first); empty for runs written before compositions existed. A metric recorded
    as None at every evaluation of a composition (HD95 when no volume had a prediction) is left
    out of that composition; None evaluations are skipped in the mean."""
    by = m.get("eval_by_composition") or {}
    out = {}
    for key in m.get("eval_compositions") or list(by):
        evals = by.get(key) or []
        if evals:
            out[key] = {}
            for name in ("mean_iou", *names) if "mean_iou" in evals[0] else names:  # segmentation: no IoU
                values = [e[name] for e in evals if e.get(name) is not None]  # HD95: None without a prediction
                if values:
                    out[key][name] = values[-1]
                    out[key][f"{name}_last3"] = float(np.mean(values[-3:]))
    return out


def paired(a: Sequence[float], b: Sequence[float], n_boot: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Paired comparison of ``a`` against ``b`` (same seeds, same order).

    Returns:
        dict: ``diffs`` (a - b per seed), ``mean`` and ``std`` (ddof 1; 0 with one seed) of the
        differences, ``wins`` / ``losses`` / ``ties`` (seeds where a > b, a < b, a == b),
        ``p_sign`` (two-sided exact sign test over the non-zero differences, scipy's
        ``binomtest``), ``p_t`` (two-sided paired t-test, scipy's ``ttest_1samp`` on the
        differences; 1 with fewer than two seeds or all differences equal), ``ci95``
        (percentile bootstrap interval of the mean difference, ``n_boot`` resamples) and
        ``reading``: ``"a ahead"`` / ``"b ahead"`` when both the t-test (p < 0.05) and the
        bootstrap interval exclude no difference and the seeds agree in majority, ``"level"``
        otherwise, ``"too few seeds"`` below two pairs.
    """
    from scipy.stats import binomtest, ttest_1samp

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    p = binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1) if len(d) else np.zeros(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    std = float(d.std(ddof=1)) if len(d) > 1 else 0.0
    p_t = float(ttest_1samp(d, 0.0).pvalue) if len(d) > 1 and std > 0 else 1.0
    if len(d) < 2:
        reading = "too few seeds"
    elif p_t < 0.05 and lo > 0 and wins > losses:
        reading = "a ahead"
    elif p_t < 0.05 and hi < 0 and losses > wins:
        reading = "b ahead"
    else:
        reading = "level"
    return {"diffs": d.tolist(), "mean": float(d.mean()) if len(d) else 0.0, "std": std, "wins": wins,
            "losses": losses, "ties": len(d) - wins - losses, "p_sign": float(p), "p_t": p_t,
            "ci95": (float(lo), float(hi)), "reading": reading}


def _reading(x: str, y: str, r: Mapping[str, Any]) -> str:
    return {"a ahead": f"{x} ahead", "b ahead": f"{y} ahead"}.get(r["reading"], r["reading"])


def _differing_settings(runs: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, list[Any]]:
    values: dict[str, set[str]] = {}
    for by_seed in runs.values():
        for m in by_seed.values():
            for k, v in m["args"].items():
                if k not in _FREE:
                    values.setdefault(k, set()).add(json.dumps(v))
    return {k: sorted(json.loads(x) for x in v) for k, v in values.items() if len(v) > 1}


def _ms(values: Sequence[float]) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v.mean():.3f}"


def ablation_table(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]], names: Sequence[str], headline: str, memory_warmup: int,
) -> str:
    """The markdown report: per seed, mean ± standard deviation (ddof 1) over seeds, and the paired
    comparisons (c) - (b), (c) - (a), (b) - (a) over the seeds both arms have; with runs evaluated
    in several compositions (``--eval-batch-sizes``, ``--eval-beside-largest``), the headline
    metric in each, the comparisons of arms in each, and per arm each composition against the
    item alone (batch 1)."""
    s = {arm: {seed: summarize(m, names, memory_warmup) for seed, m in sorted(by.items())} for arm, by in runs.items()}
    comp = {arm: {seed: summarize_compositions(m, names) for seed, m in sorted(by.items())} for arm, by in runs.items()}
    keys = list(dict.fromkeys(k for by in comp.values() for c in by.values() for k in c))
    shown = ("mean_iou", *names)
    lines = []
    differ = _differing_settings(runs)
    if differ:
        lines += [f"**Warning: the runs differ in settings other than the seed:** {differ}", ""]
    commits = sorted({m.get("commit", "") for by in runs.values() for m in by.values()} - {""})
    any_run = next(iter(next(iter(runs.values())).values()))
    lines += [
        f"Steps {any_run['steps'][-1]}, global batch {any_run['global_batch']} "
        f"({any_run['world_size']} process(es)); held-out numbers are the mean of the last 3 evaluations "
        f"(every {any_run['args']['eval_every']} steps"
        f"{', in the headline composition, ' + composition_label(keys[0]) if keys else ''})"
        f"{'; commit ' + ', '.join(commits) if commits else ''}.",
        "",
        "Per seed (last 3: " + " / ".join(shown) + "):",
        "",
        "| seed | " + " | ".join(ARM_LABELS.get(a, a) for a in s) + " |",
        "|---|" + "---|" * len(s),
    ]
    seeds = sorted({seed for by in s.values() for seed in by})
    for seed in seeds:
        cells = [" / ".join(f"{by[seed][f'{n}_last3']:.3f}" for n in shown) if seed in by else "-" for by in s.values()]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Mean ± std over seeds:",
        "",
        "| arm | seeds | " + " | ".join(f"{n} (last 3)" for n in shown) + " | "
        + " | ".join(f"{n} (final)" for n in shown) + f" | train loss | s/step | RSS growth, step {memory_warmup} -> end |",
        "|---|---|" + "---|" * (2 * len(shown) + 3),
    ]
    for arm, by in s.items():
        vals = list(by.values())
        lines.append(
            f"| {ARM_LABELS.get(arm, arm)} | {len(vals)} | "
            + " | ".join(_ms([v[f"{n}_last3"] for v in vals]) for n in shown) + " | "
            + " | ".join(_ms([v[n] for v in vals]) for n in shown) + " | "
            + f"{_ms([v['final_loss'] for v in vals])} | {_ms([v['s_per_step'] for v in vals])} | "
            + f"{_ms([v['rss_growth_pct'] for v in vals])} % |"
        )
    pairs = [(x, y) for x, y in (("sine", "grid"), ("sine", "none"), ("grid", "none")) if x in s and y in s]
    if pairs:
        lines += [
            "",
            "Paired comparison (per-seed differences of the last-3 values over the seeds both arms have; "
            "mean ± std of the differences; two-sided sign test and paired t-test; bootstrap 95 % interval "
            "of the mean difference; an arm is called ahead only when the t-test gives p < 0.05, the "
            "bootstrap interval excludes 0 and it wins more seeds than it loses, else the arms are level):",
            "",
            "| comparison | metric | per-seed differences | mean ± std | wins / losses / ties | sign test p "
            "| t-test p | bootstrap 95 % CI | reading |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        verdicts = []
        for x, y in pairs:
            common = sorted(set(s[x]) & set(s[y]))
            for n in (headline, *[k for k in shown if k != headline]) if (x, y) == ("sine", "grid") else (headline,):
                r = paired([s[x][c][f"{n}_last3"] for c in common], [s[y][c][f"{n}_last3"] for c in common])
                lines.append(_paired_row(f"{x} - {y}", n, r, _reading(x, y, r)))
                if n == headline:
                    verdicts.append(_verdict(x, y, n, common, r))
            for key in keys[1:]:  # the headline metric in the other compositions
                common = sorted(c for c in set(comp[x]) & set(comp[y]) if key in comp[x][c] and key in comp[y][c])
                if common:
                    r = paired([comp[x][c][key][f"{headline}_last3"] for c in common],
                               [comp[y][c][key][f"{headline}_last3"] for c in common])
                    where = f"{headline} {_at(key)}"
                    lines.append(_paired_row(f"{x} - {y}", where, r, _reading(x, y, r)))
                    verdicts.append(_verdict(x, y, where, common, r))
        lines += ["", "What the numbers show:", "", *verdicts]
    if keys:
        lines += _composition_section(comp, keys, headline)
    return "\n".join(lines) + "\n"


def _paired_row(label: str, metric: str, r: Mapping[str, Any], reading: str) -> str:
    return (f"| {label} | {metric} | " + ", ".join(f"{d:+.3f}" for d in r["diffs"])
            + f" | {r['mean']:+.3f} ± {r['std']:.3f} | {r['wins']} / {r['losses']} / {r['ties']} | "
            f"{r['p_sign']:.3f} | {r['p_t']:.3f} | [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] | {reading} |")


def _composition_section(
    comp: Mapping[str, Mapping[int, Mapping[str, Mapping[str, float]]]], keys: Sequence[str], headline: str,
) -> list[str]:
    """Per arm and seed, the headline metric in every composition and its difference from the item
    alone; per arm, the paired composition - alone over seeds with the report's rule."""
    h = f"{headline}_last3"
    against = [k for k in keys if k != ALONE] if ALONE in keys else []
    lines = [
        "",
        f"Held-out {headline} by evaluation composition (mean of the last 3 evaluations; batch 1 is each "
        "item alone; the differences are per seed, the composition minus alone):",
        "",
        "| arm | seed | " + " | ".join([composition_label(k) for k in keys]
                                       + [f"{composition_label(k)} - alone" for k in against]) + " |",
        "|---|---|" + "---|" * (len(keys) + len(against)),
    ]
    comp = {arm: {seed: c for seed, c in by.items() if c} for arm, by in comp.items()}  # runs that recorded any
    for arm, by in comp.items():
        for seed, c in by.items():
            cells = [f"{c[k][h]:.3f}" if k in c else "-" for k in keys]
            cells += [f"{c[k][h] - c[ALONE][h]:+.3f}" if k in c and ALONE in c else "-" for k in against]
            lines.append(f"| {ARM_LABELS.get(arm, arm)} | {seed} | " + " | ".join(cells) + " |")
    if not against:
        return lines + ["", "No evaluation one item at a time (batch 1): no comparison against alone."]
    lines += [
        "",
        "Batch against alone, per arm (per-seed differences of the last-3 values, the composition minus "
        "alone; the same tests and rule as the comparison of arms):",
        "",
        "| arm | comparison | metric | per-seed differences | mean ± std | wins / losses / ties | sign test p "
        "| t-test p | bootstrap 95 % CI | reading |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for arm, by in comp.items():
        for key in against:
            seeds = [seed for seed, c in by.items() if key in c and ALONE in c]
            if not seeds:
                continue
            r = paired([by[c][key][h] for c in seeds], [by[c][ALONE][h] for c in seeds])
            label = composition_label(key)
            reading = {"a ahead": f"higher {_at(key)}", "b ahead": "higher alone"}.get(r["reading"], r["reading"])
            lines.append(f"| {ARM_LABELS.get(arm, arm)} " + _paired_row(f"{label} - alone", headline, r, reading))
            verdicts.append(_batch_verdict(arm, key, headline, seeds, r))
    return lines + ["", "What the evaluation batch does:", "", *verdicts]


def stats_clause(r: Mapping[str, Any]) -> str:
    """The statistics behind one reading of :func:`paired`, in the words every sentence of the
    reports uses: ``(t-test p = .., bootstrap 95 % interval [.., ..], sign test p = ..).``"""
    return (f"(t-test p = {r['p_t']:.3f}, bootstrap 95 % interval [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}], "
            f"sign test p = {r['p_sign']:.3f}).")


def _batch_verdict(arm: str, key: str, metric: str, seeds: Sequence[int], r: Mapping[str, Any]) -> str:
    """One plain sentence: does evaluating ``arm`` in composition ``key`` instead of alone change
    ``metric``?"""
    label, at = composition_label(key), _at(key)
    if len(seeds) < 2:
        return (f"- {arm}, {metric} {at} against alone: {len(seeds)} seed(s); too few to compare "
                f"(difference {r['mean']:+.3f} on seed(s) {list(seeds)}).")
    head = (f"- {arm}, {metric} (last 3) over seeds {list(seeds)}: {label} - alone = {r['mean']:+.3f} ± "
            f"{r['std']:.3f}; higher {at} on {r['wins']} seed(s), alone on {r['losses']}, {r['ties']} tie(s); ")
    stats = stats_clause(r)
    if r["reading"] == "level":
        return head + "**level: the report's rule calls no difference** " + stats
    return head + f"**the batch changes it: higher {at if r['reading'] == 'a ahead' else 'alone'}** " + stats


def _verdict(x: str, y: str, metric: str, seeds: Sequence[int], r: Mapping[str, Any]) -> str:
    """One plain sentence on the headline metric of one paired comparison."""
    n = len(seeds)
    if n < 2:
        return (f"- {x} vs {y}: {n} seed(s) in common; too few to compare ({metric} difference "
                f"{r['mean']:+.3f} on seed(s) {list(seeds)}).")
    head = (f"- {x} vs {y}, {metric} (last 3) over seeds {list(seeds)}: {x} - {y} = {r['mean']:+.3f} ± {r['std']:.3f}; "
            f"{x} better on {r['wins']} seed(s), {y} on {r['losses']}, {r['ties']} tie(s); ")
    if r["reading"] == "level":
        return head + "**the arms are level** " + stats_clause(r)
    return head + f"**{_reading(x, y, r)}** " + stats_clause(r)


def plot_curves(runs: Mapping[str, Mapping[int, Mapping[str, Any]]], headline: str, path: str) -> str:
    """Writes a PNG: train loss (moving mean), held-out mean IoU, held-out ``headline`` and
    resident memory against the step; one thin line per seed, the mean over seeds thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4), dpi=80)
    colors = dict(zip(runs, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for arm, by in runs.items():
        c = colors[arm]
        for j, (key, ax) in enumerate(zip(("loss_last", "mean_iou", headline, "rss_mb"), axes)):
            curves = []
            for m in by.values():
                if key in ("loss_last", "rss_mb"):
                    y = np.asarray(m[key], dtype=float)
                    k = max(1, len(y) // 50) if key == "loss_last" else 1
                    y = np.convolve(y, np.ones(k) / k, mode="valid")
                    x = np.arange(len(y)) + k
                else:
                    x = np.asarray([e["step"] for e in m["eval"]])
                    y = np.asarray([e[key] for e in m["eval"]])
                ax.plot(x, y, color=c, alpha=0.3, lw=0.8)
                curves.append((x, y))
            n = min(len(y) for _, y in curves)
            label = f"{ARM_LABELS.get(arm, arm)} (n={len(curves)})" if j == 1 else None
            ax.plot(curves[0][0][:n], np.mean([y[:n] for _, y in curves], 0), color=c, lw=2, label=label)
    titles = ("train loss, last layer (moving mean)", "held-out mean IoU (matched)", f"held-out {headline}",
              "resident memory, rank 0 (MiB)")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _span(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def tiny_summary(runs: Mapping[str, Mapping[str, Any]], full_steps: int, doc: str, metric: str = "AP",
                 compared: str = "arm") -> list[str]:
    """What a ``--tiny`` run prints instead of the tables: per arm, the train loss (last decoder
    layer) as the mean of the first quarter of the steps against the mean of the last quarter (a
    single step is too noisy at batch 2), then :data:`TINY_NOTE`.

    Args:
        runs (mapping): ``{arm: metrics}``, the metrics of one run per arm
            (:func:`vispos.app.train.engine.train_arm`'s; the segmentation run's have the same
            ``steps`` and ``loss_last``).
        full_steps (int): a full run's default ``--steps`` (:func:`vispos.app.train._args.full_defaults`).
        doc (str): the page that documents the full run.
        metric (str): the held-out metric's name.
        compared (str): what a full run compares (``"arm"``, ``"pipeline"``).

    Returns:
        list of str: one line per arm, then the note.
    """
    lines = []
    steps = 0
    for arm, m in runs.items():
        loss, at = m["loss_last"], m["steps"]
        k = max(1, len(loss) // 4)
        early, late = float(np.mean(loss[:k])), float(np.mean(loss[-k:]))
        trend = "falling" if late < early else "not falling"
        lines.append(f"[{arm}] train loss, mean of {_span(at[0], at[k - 1])} -> {_span(at[-k], at[-1])}: "
                     f"{early:.3f} -> {late:.3f} ({trend})")
        steps = max(steps, at[-1])
    return [*lines, TINY_NOTE.format(steps=steps, metric=metric, compared=compared, full_steps=full_steps, doc=doc)]
