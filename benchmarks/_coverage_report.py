"""The report of ``benchmarks/invariance_coverage.py``: refusal messages grouped by reason, the
counts, and the markdown tables (counts, per source, refusals by reason, one row per model)."""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter, defaultdict

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the largest difference, relative to the output's largest value, that counts as exact in float64
TOL = 1e-9
STATUSES = ("exact", "refused", "SILENT", "error", "skipped")

#: (pattern of a refusal message, the short reason the table groups it under)
REASONS = [
    (r"torch\.fx cannot trace|traces .* with torch\.fx, which fails", "torch.fx cannot trace a layer"),
    (r"cannot use the torch\.fx trace", "the trace differs from the eager forward"),
    (r"'same' padding", "TensorFlow 'same' padding"),
    (r"windows are laid out on the canvas", "windowed attention on the canvas (Swin)"),
    (r"fixed patch grid|position table|adds a fixed spatial tensor", "fixed spatial tensor (position table)"),
    (r"flattens the spatial axes", "spatial axes flattened (tokens, a flatten)"),
    (r"reshapes, moves or mixes cells|mixes or moves cells", "cells reshaped, moved or mixed"),
    (r"reshapes to spatial sizes", "reshape to sizes other than the map's own"),
    (r"reshapes a feature map to \d+ axes", "reshape merging or splitting the spatial axes"),
    (r"reshapes a map whose spatial axes were moved", "reshape of a map whose spatial axes were moved"),
    (r"over the channels without keepdim", "channel reduction without keepdim"),
    (r"axes were permuted", "an op on a channels-last map without a rule"),
    (r"layer norm over the trailing axes", "layer norm over trailing axes"),
    (r"pixel shuffle", "pixel shuffle"),
    (r"no rule for this function", "function without a rule"),
    (r"does not know how to run|no rule for it", "module without a rule"),
    (r"output_size=", "adaptive pool to a size > 1"),
    (r"indexing a feature map", "spatial indexing"),
    (r"concatenates feature maps along a spatial axis|splits a feature map along a spatial", "spatial cat / split"),
    (r"ceil_mode", "average pool ceil_mode"),
    (r"levels were asked", "levels the graph does not see"),
    (r"probe items .* do not (each )?get what they get", "probe: items differ in a padded batch"),
    (r"cannot run on a probe|no probe size", "cannot run at the probe size"),
    (r"does not fit in memory", "probe over the memory budget (pass a smaller probe_size)"),
    (r"to read its channels from", "input channels not read (pass in_channels)"),
    (r"size of a feature map|read from a map's size|value read from", "value read from a map's size"),
]


def refusal_reason(message: str) -> str:
    """A short key for a refusal message (the table groups refusals by it)."""
    for pattern, key in REASONS:
        if re.search(pattern, message):
            return key
    clause = re.search(r"exactly on a padded batch: ([^(.;:]+)", message)  # the rewriter's wording
    return (clause.group(1).strip() if clause else first_line(message))[:90]


def first_line(message: str) -> str:
    return (str(message).strip().splitlines() or [""])[0]


def summarise(results: list[dict]) -> dict:
    counts = Counter(r["status"] for r in results)
    refusals = defaultdict(list)
    for r in results:
        if r["status"] == "refused":
            refusals[r["reason"]].append(r["model"])
    return {"models": len(results), "counts": {s: counts.get(s, 0) for s in STATUSES},
            "refusals": dict(sorted(refusals.items(), key=lambda kv: (-len(kv[1]), kv[0])))}


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def markdown(results: list[dict], header: str, rows: bool = True) -> str:
    """The coverage report: counts, counts per source, refusals grouped by reason, and (``rows``)
    one row per model."""
    s = summarise(results)
    c = s["counts"]
    lines = [header, "", "| outcome | models |", "|---|---:|"]
    lines += [f"| {'**SILENT** (accepted, inexact)' if k == 'SILENT' else k} | {'**%d**' % v if k == 'SILENT' else v} |"
              for k, v in c.items()]
    lines += [f"| total | {s['models']} |", "", "Per source:", "", "| source | " + " | ".join(STATUSES) + " |",
              "|---|" + "---:|" * len(STATUSES)]
    for source in sorted({r["source"] for r in results}):
        per = Counter(r["status"] for r in results if r["source"] == source)
        lines.append(f"| {source} | " + " | ".join(str(per.get(k, 0)) for k in STATUSES) + " |")
    lines += ["", "Refusals by reason:", "", "| reason | models | which |", "|---|---:|---|"]
    for reason, models in s["refusals"].items():
        lines.append(f"| {reason} | {len(models)} | {', '.join(models)} |")
    if not rows:
        return "\n".join(lines) + "\n"
    lines += ["", "Every model (relative differences: worst over items and outputs; in training also running "
              "statistics and parameter gradients):", "",
              "| model | source | outcome | eval | training | reason, or where it differs |",
              "|---|---|---|---:|---:|---|"]
    for r in results:
        note = r.get("where") if r["status"] == "SILENT" else r.get("note") or r.get("reason", "")
        if r["status"] in ("refused", "error") and r.get("message"):
            note = f"{r['exception']}: {r['message'][:160]}"
        note = (note or "").replace("|", "\\|")
        lines.append(f"| {r['model']} | {r['source']} | {r['status']} | {_fmt(r.get('eval_rel'))} | "
                     f"{_fmt(r.get('train_rel'))} | {note} |")
    return "\n".join(lines) + "\n"


def versions(commit: str | None = None) -> str:
    import timm
    import torchvision

    try:
        import monai
        monai_version = monai.__version__
    except ImportError:
        monai_version = "absent"
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip()
        except OSError:
            commit = ""
    return (f"torch {torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}, "
            f"MONAI {monai_version}; vispos at {commit or '?'}; float64, tolerance {TOL:g}")


def merged_header(results: list[dict], headers: list[str]) -> str:
    """One header for shards run at once: the model count of all, the longest wall time."""
    seconds = max(int(m.group(1)) for h in headers if (m := re.search(r"\((\d+) s on", h)))
    head = re.sub(r"\d+ architectures", f"{len(results)} architectures", headers[0])
    return re.sub(r"\(\d+ s on (\d+) cores, one thread\)",
                  rf"({seconds} s on \1 cores, {len(headers)} shards of one thread at once)", head)
