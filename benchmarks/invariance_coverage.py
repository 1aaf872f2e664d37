"""Which architectures ``vispos.make_padding_invariant`` makes exact, which it refuses and why, and
that none is silently inexact: the coverage table of docs/padding-invariance.md.

For every architecture of ``benchmarks/_coverage_cases.py`` (torchvision, timm and MONAI; random
initialisation, no download; float64; dropout and stochastic depth off, since a draw on a canvas is
not the draw alone), with trained-like normalisation (random running mean / variance, weight and
bias in every norm: fresh statistics keep zero padding zero and hide a leak):

* ``make_padding_invariant(model)`` either raises (the refusal: its exception type and the first
  line of its message) or returns the wrapped model;
* eval: each of two items (the partner larger along an axis) in a padded batch (padding filled
  with 5.0, the canvas beyond both) against the stock model on the item alone, every output;
* training: two items of one size on a larger padded canvas against the stock model on the two
  items unpadded (batch statistics over the same cells): every output, every running statistic
  and batch count after that step, and every parameter gradient of the outputs' mean square.

``exact``: the largest difference, relative to the largest value of each output (statistic,
gradient), is at most :data:`TOL` in both modes (in training, or within :data:`NOISE` times the
stock model's own difference when the items come in the other order, measured where it matters).
``SILENT``: accepted, and an item does not get what it gets alone (the bug this table is for).
``refused``: ``ValueError`` when wrapping, or when called on an input the stock model takes.
``error``: another exception from vispos. ``skipped``: the stock model cannot run these sizes, or
the model is too large or slow for two CPU cores (the reason said).
Each model runs in its own forked process with a time and memory budget.

    python benchmarks/invariance_coverage.py --quick
    nice -n 10 python benchmarks/invariance_coverage.py --json /tmp/coverage.json \\
        --markdown benchmarks/results_invariance_coverage.md
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import re
import resource
import sys
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, os.path.join(ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from _coverage_cases import QUICK, Case, all_cases  # noqa: E402
from _coverage_report import (  # noqa: E402,F401 - STATUSES and refusal_reason: this module's vocabulary too
    STATUSES, TOL, first_line, markdown, merged_header, refusal_reason, summarise, versions,
)
from trained_norms import trained_like  # noqa: E402

#: training also counts as exact within this factor of the stock model's own noise (:func:`stock_noise`)
NOISE = 10.0
#: the fill of a padded batch's padding
FILL = 5.0
#: larger models are skipped (two CPU cores, float64)
MAX_PARAMS = 60_000_000

def no_draws(model: nn.Module) -> nn.Module:
    """Dropout, drop-path and stochastic depth off (in place): a draw over a padded canvas is not
    the draw over the item alone, so training is compared without draws."""
    for m in model.modules():
        kind = type(m).__name__.lower()
        if isinstance(m, nn.modules.dropout._DropoutNd) or "drop" in kind or "stochastic" in kind:
            if isinstance(getattr(m, "p", None), float):
                m.p = 0.0
        for attr in ("drop_prob", "drop_rate", "drop_path_rate", "drop_connect_rate", "drop_path_prob"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return model


def _leaves(value):
    from vispos import NestedTensor

    return torch.utils._pytree.tree_leaves(value, is_leaf=lambda v: isinstance(v, NestedTensor))


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|``; inf where ``got`` is not finite but ``want`` is."""
    got, want = got.detach(), want.detach()
    if got.shape != want.shape:
        return float("inf")
    if not torch.isfinite(got).all() and torch.isfinite(want).all():
        return float("inf")
    scale = float(want.abs().max()) if want.numel() else 0.0
    return float((got - want).abs().max()) / (scale or 1.0) if want.numel() else 0.0


def item_part(got, want: torch.Tensor, items: slice):
    """The part of the output leaf ``got`` (a NestedTensor or tensor of the padded batch) that
    belongs to ``items``, shaped as their own ``want``; None when the leaf's mask marks any of those
    cells as padding."""
    from vispos import NestedTensor

    if isinstance(got, NestedTensor):
        region = (items, *(slice(0, s) for s in want.shape[2:]))
        if got.mask is not None and got.mask[region].any():
            return None
        return got.tensors[(region[0], slice(None), *region[1:])]
    if isinstance(got, torch.Tensor) and got.dim() and want.dim():
        return got[items]  # one row per item
    return got


def differences(batched, alone, items: slice) -> list[tuple[float, str, object]]:
    """``(relative difference, where, part)`` for every output leaf: ``items``' part of ``batched``
    against the matching leaf of ``alone`` (inf where a mask is wrong or the leaves do not match)."""
    got, want = _leaves(batched), [w for w in _leaves(alone) if isinstance(w, torch.Tensor)]
    if len(got) != len(want):
        return [(float("inf"), f"{len(got)} outputs where the items alone get {len(want)}", None)]
    out = []
    for i, (g, w) in enumerate(zip(got, want)):
        part = item_part(g, w, items)
        rel = relative(part, w) if isinstance(part, torch.Tensor) else float("inf")
        out.append((rel, f"output {i} {tuple(w.shape)}" + ("" if part is not None else " (masked as padding)"), part))
    return out


def _worst(pairs, prefix: str, worst: float = 0.0, where: str = "") -> tuple[float, str]:
    for rel, at, *_ in pairs:
        if not rel <= worst:
            worst, where = rel, f"{prefix}{at}"
    return worst, where


def gradient_differences(model: nn.Module, twin: nn.Module) -> list[tuple[float, str]]:
    """Every parameter gradient of ``twin`` (the padded batch) against ``model``'s (the items alone),
    relative to its largest value or to 1e-3 of the largest gradient of all, whichever is larger
    (a gradient that is zero in exact arithmetic, a bias before a batch norm, is rounding noise)."""
    grads = [(name, p1.grad, p2.grad) for (name, p1), p2 in zip(model.named_parameters(), twin.parameters())]
    top = max((float(g.abs().max()) for _, g, _ in grads if g is not None and g.numel()), default=0.0)
    out = []
    for name, want, got in grads:
        if want is None:
            out.append((float("inf") if got is not None and got.any() else 0.0, f"{name}.grad"))
        elif got is None or got.shape != want.shape or not torch.isfinite(got).all():
            out.append((float("inf"), f"{name}.grad"))
        else:
            scale = max(float(want.abs().max()), 1e-3 * top) or 1.0
            out.append((float((got - want).abs().max()) / scale, f"{name}.grad"))
    return out


def padded(items: list[torch.Tensor], multiple: int):
    """A NestedTensor of ``items`` at the origin of a canvas a multiple of ``multiple`` beyond the
    largest item on every axis (each item padded on every axis), :data:`FILL` in the padding."""
    from vispos import NestedTensor, Padding

    sizes = [tuple(x.shape[1:]) for x in items]
    canvas = tuple((max(s) + multiple // 2 + multiple - 1) // multiple * multiple for s in zip(*sizes))
    tensors = torch.full((len(items), items[0].shape[0], *canvas), FILL, dtype=items[0].dtype)
    for b, x in enumerate(items):
        tensors[(b, slice(None), *(slice(0, s) for s in x.shape[1:]))] = x
    return NestedTensor(tensors, Padding.from_sizes(sizes, canvas))


def in_channels(model: nn.Module) -> int:
    for m in model.modules():
        if isinstance(m, nn.modules.conv._ConvNd):
            return m.in_channels
    return 3


def _stock_sizes(model: nn.Module, case: Case, channels: int):
    """The first ``(item, partner)`` pair of ``case.sizes`` the stock model runs alone (eval and
    training), and the items; None when none runs."""
    g = torch.Generator().manual_seed(0)
    for item, partner in case.sizes:
        xs = [torch.randn(channels, *s, generator=g, dtype=torch.float64) for s in (item, partner)]
        xs.append(torch.randn(channels, *item, generator=g, dtype=torch.float64))
        try:
            with torch.no_grad():
                model.eval()
                alone = [model(x[None]) for x in xs[:2]]
                model.train()
                copy.deepcopy(model)(torch.stack([xs[0], xs[2]]))
        except Exception:  # noqa: BLE001 - the stock model cannot run these sizes: try the next
            continue
        finally:
            model.eval()
        return xs, alone
    return None


def _fail(out: dict, exc: BaseException, when: str) -> dict:
    kind = type(exc).__name__
    line = first_line(str(exc))
    if isinstance(exc, ValueError):
        reason = refusal_reason(str(exc))
        return out | {"status": "refused", "reason": reason if when == "wrap" else f"{reason} ({when})",
                      "exception": kind, "message": line[:300], "when": when}
    return over_memory(out | {"status": "error", "reason": f"{kind} ({when})", "exception": kind,
                              "message": line[:300], "when": when})


def over_memory(result: dict) -> dict:
    """An error that is an allocation refused by the memory budget (torch raises it as a
    RuntimeError) is ``skipped``, with the size asked for."""
    asked = re.search(r"can't allocate memory: you tried to allocate (\d+) bytes", result.get("message", ""))
    if result["status"] != "error" or asked is None:
        return result
    return result | {"status": "skipped", "reason": f"over the memory budget ({result['when']}: "
                                                    f"{int(asked.group(1)) / 2**30:.1f} GiB asked in one tensor)"}


def check(case: Case) -> dict:
    """The outcome of one architecture: ``{"model", "source", "status", "reason", "exception",
    "message", "eval_rel", "train_rel", "where", "params"}`` (``status`` one of :data:`STATUSES`)."""
    import vispos

    out = {"model": case.name, "source": case.source, "status": "", "reason": "", "exception": "", "message": "",
           "eval_rel": None, "train_rel": None, "where": "", "params": 0}
    torch.manual_seed(0)
    try:
        model = case.build()
    except Exception as exc:  # noqa: BLE001 - the library cannot build it here: not vispos' promise
        return out | {"status": "skipped", "reason": f"cannot build: {type(exc).__name__}",
                      "message": first_line(str(exc))[:200]}
    out["params"] = sum(p.numel() for p in model.parameters())
    if out["params"] > MAX_PARAMS:
        return out | {"status": "skipped", "reason": f"too large for two CPU cores ({out['params'] / 1e6:.0f}M "
                                                     f"parameters > {MAX_PARAMS / 1e6:.0f}M)"}
    model = trained_like(no_draws(model)).double().eval()
    twin = copy.deepcopy(model)
    try:
        inv = vispos.make_padding_invariant(twin)
    except Exception as exc:  # noqa: BLE001 - a refusal (ValueError) or a crash, both recorded
        return _fail(out, exc, "wrap")
    channels = getattr(inv, "in_channels", None) or in_channels(model)
    found = _stock_sizes(model, case, channels)
    if found is None:
        return out | {"status": "skipped", "reason": "the stock model runs none of the sizes tried"}
    xs, alone = found
    for key, value in model.state_dict().items():  # wrapping leaves the model's state as it was
        if isinstance(value, torch.Tensor) and relative(twin.state_dict()[key], value) > TOL:
            return out | {"status": "SILENT", "where": f"wrapping changed {key}"}
    try:  # eval: each item beside the other in a padded batch
        inv.eval()
        with torch.no_grad():
            batched = inv(padded(xs[:2], case.multiple))
        worst, where = 0.0, ""
        for b in range(2):
            worst, where = _worst(differences(batched, alone[b], slice(b, b + 1)), f"eval, item {b}, ", worst, where)
        out.update(eval_rel=worst, where=where)
    except Exception as exc:  # noqa: BLE001
        return _fail(out, exc, "eval call")
    try:  # training: two items of one size padded, against the two unpadded; statistics, gradients
        control = copy.deepcopy(model)  # the stock model's own rounding noise, measured if needed
        model.train()
        inv.train()
        pair = torch.stack([xs[0], xs[2]])
        stock = model(pair)
        diffs = differences(inv(padded(list(pair), case.multiple)), stock, slice(None))
        worst, where = _worst(diffs, "training, ")
        mine = twin.state_dict()
        worst, where = _worst([(relative(mine[k].double(), v.double()), k) for k, v in model.state_dict().items()
                               if isinstance(v, torch.Tensor)], "training, ", worst, where)
        want = [w for w in _leaves(stock) if isinstance(w, torch.Tensor) and w.requires_grad]
        if want and all(isinstance(d[2], torch.Tensor) for d in diffs):
            sum(w.square().mean() for w in want).backward()
            sum(d[2].square().mean() for d in diffs if d[2].requires_grad).backward()
            worst, where = _worst(gradient_differences(model, twin), "training, ", worst, where)
        out.update(train_rel=worst)
        if not worst <= (out["eval_rel"] or 0.0):
            out["where"] = where
        if not worst <= TOL:
            out["noise"] = stock_noise(control, pair, model, stock)
    except Exception as exc:  # noqa: BLE001
        return _fail(out, exc, "training call")
    noise = NOISE * out.get("noise", 0.0)
    exact = out["eval_rel"] <= TOL and out["train_rel"] <= max(TOL, noise)
    if exact and out["train_rel"] > TOL:
        out["note"] = (f"training within {NOISE:g}x the stock model's own rounding noise ({out['noise']:.1e}: the "
                       "items in the other order)")
    return out | {"status": "exact" if exact else "SILENT"}


def stock_noise(control: nn.Module, pair: torch.Tensor, model: nn.Module, stock) -> float:
    """How far the stock model's training step moves with the items' order alone: ``control`` (a
    copy of the model before the step) on ``pair`` reversed, against ``model`` after its step on
    ``pair`` (its outputs ``stock``, running statistics, gradients). A deep, ill-conditioned
    network (ConvMixer's 32 batch-normed blocks on a few cells) differs from itself there by more
    than :data:`TOL`."""
    control.train()
    outs = control(pair.flip(0))
    outs = torch.utils._pytree.tree_map(lambda t: t.flip(0) if isinstance(t, torch.Tensor) and t.dim() else t, outs)
    leaves = [w for w in _leaves(outs) if isinstance(w, torch.Tensor)]
    want = [w for w in _leaves(stock) if isinstance(w, torch.Tensor)]
    sum(w.square().mean() for w in leaves if w.requires_grad).backward()
    mine = control.state_dict()
    worst, _ = _worst([(relative(g, w), "") for g, w in zip(leaves, want)], "")
    worst, _ = _worst([(relative(mine[k].double(), v.double()), k) for k, v in model.state_dict().items()
                       if isinstance(v, torch.Tensor)], "", worst)
    worst, _ = _worst(gradient_differences(model, control), "", worst)
    return worst


def _child(case: Case, conn, memory_gb: float) -> None:
    torch.set_num_threads(1)
    if memory_gb > 0:  # address space: what the process holds now plus the budget
        with open("/proc/self/statm") as f:
            held = int(f.read().split()[0]) * resource.getpagesize()
        limit = held + int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        result = check(case)
    except MemoryError:
        result = {"model": case.name, "source": case.source, "status": "skipped",
                  "reason": f"over the memory budget ({memory_gb:g} GiB)"}
    conn.send(result)
    conn.close()


def run_isolated(case: Case, timeout: float, memory_gb: float) -> dict:
    """:func:`check` in a forked process: ``skipped`` with the reason when it runs past ``timeout``
    seconds, or dies (out of memory)."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(case, send, memory_gb), daemon=True)
    proc.start()
    send.close()
    result, timed_out = None, not receive.poll(timeout)
    if not timed_out:
        try:
            result = receive.recv()
        except EOFError:  # the process died before it answered
            pass
        proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if result is None:
        why = (f"over the time budget ({timeout:g} s)" if timed_out
               else f"the process died (exit code {proc.exitcode}; memory budget {memory_gb:g} GiB)")
        result = {"model": case.name, "source": case.source, "status": "skipped", "reason": why}
    return result


def sweep(args) -> tuple[list[dict], str]:
    """Every selected case checked (isolated unless ``--no-isolate``), one line printed per model;
    the results and the report's header."""
    torch.set_num_threads(1)
    import monai  # noqa: F401 - imported once before forking, as vispos and the model libraries
    import timm  # noqa: F401
    import torchvision  # noqa: F401

    import vispos  # noqa: F401

    cases = all_cases()
    wanted = QUICK if args.quick else args.models
    if wanted:
        cases = [c for c in cases if c.name in wanted or c.key in wanted]
    if args.shard:
        k, n = (int(v) for v in args.shard.split("/"))
        cases = cases[k - 1::n]
    results, start = [], time.perf_counter()
    for case in cases:
        t0 = time.perf_counter()
        result = check(case) if args.no_isolate else run_isolated(case, args.timeout, args.memory_gb)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(result)
        print(f"{result['status']:8s} {case.source:11s} {case.name:40s} {result['seconds']:6.1f} s  "
              f"{result.get('where') or result.get('reason', '')}", flush=True)
    summary = summarise(results)
    header = (f"Coverage of `vispos.make_padding_invariant`: {summary['models']} architectures "
              f"({time.perf_counter() - start:.0f} s on {os.cpu_count()} cores, one thread). {versions(args.commit)}.")
    return results, header


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    p.add_argument("--models", nargs="*", default=None, help="only these models (name, or source:name)")
    p.add_argument("--json", default=None, help="write every model's outcome and the counts to this file")
    p.add_argument("--markdown", default=None, help="write the report (counts, refusals, rows) to this file")
    p.add_argument("--summary", default=None, help="write the report without the per-model rows (the docs' table)")
    p.add_argument("--from-json", nargs="+", default=None,
                   help="write the reports from these --json files (shards merged) instead of running")
    p.add_argument("--shard", default=None, help="K/N: only every N-th model from the K-th (1-based), to run N at once")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model before it is skipped")
    p.add_argument("--memory-gb", type=float, default=6.0, help="address space per model beyond the parent's")
    p.add_argument("--commit", default=None, help="the vispos commit to name (default: git's HEAD here)")
    p.add_argument("--no-isolate", action="store_true", help="run in this process (no time / memory budget)")
    args = p.parse_args(argv)
    if args.from_json:
        results, headers = [], []
        for path in args.from_json:
            with open(path) as f:
                saved = json.load(f)
            results += saved["results"]
            headers.append(saved["header"])
        order = {(c.source, c.name): i for i, c in enumerate(all_cases())}
        results.sort(key=lambda r: order.get((r["source"], r["model"]), len(order)))
        header = headers[0] if len(headers) == 1 else merged_header(results, headers)
        for i, r in enumerate(results):  # the reasons as this version groups them
            if r["status"] == "refused" and r.get("when", "wrap") == "wrap":
                r["reason"] = refusal_reason(r["message"])
            results[i] = over_memory(r)
    else:
        results, header = sweep(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summarise(results), "header": header, "results": results}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results, header))
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(markdown(results, header, rows=False))
    print(json.dumps(summarise(results)["counts"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
