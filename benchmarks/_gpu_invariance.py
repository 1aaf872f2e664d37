"""``gpu_check.py``'s rows of what padding invariance costs where users train: the invariant / stock
time ratio of one step (interleaved medians, CUDA events), per backbone, batch size, step and
precision, eager and compiled.

Backbones and steps are ``count_launches.py``'s (ResNet-50 with trainable and with frozen batch
norm, ConvNeXt-T, ViT-S/16 padded and packed, r3d_18), so the launch counts tracked on the CPU
and these times describe the same steps. Items: random images with sides drawn in 320-512 px (2D)
or volumes with sides in 48-80 voxels (3D), each its own size. ``float32`` runs with torch's TF32
defaults; ``bfloat16`` under ``torch.autocast``. Compiled rows: ``torch.compile`` (default mode) of
the stock and the invariant model, the training step of ResNet-50 and ViT-S at B = 8, timed warm
after two calls (compilation excluded; its time is in the row). CUDA-graph rows: the training step
(forward, backward; the batch's boxes on the host) of each arm captured once with
``torch.cuda.graph`` after three warm steps on a side stream, the replays timed.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from _measure import time_sample
from count_launches import MODELS, _model, random_batch, step_fn

#: (model, steps) of the eager rows; B = 8 and 32 each, float32 and bfloat16
EAGER = (("resnet50", ("train", "frozen", "eval")), ("convnext_tiny", ("train", "eval")),
         ("vit_small", ("train", "eval", "packed")), ("r3d_18", ("train", "eval")))
COMPILED = (("resnet50", "train"), ("vit_small", "train"))
#: the training steps captured in a CUDA graph; B = 8 and 32, float32 and bfloat16
GRAPHED = (("resnet50", "train"), ("vit_small", "train"))
SIDES = {2: (320, 512), 3: (48, 80)}


def _pair(name: str, step: str, dev: torch.device) -> dict[str, torch.nn.Module]:
    """The stock model and its invariant twin (packed for ``step == "packed"``), the same weights."""
    stock = _model(name, step, False)
    invariant = _model(name, step, True)
    invariant.load_state_dict(stock.state_dict())
    return {"stock": stock.to(dev), "invariant": invariant.to(dev)}


def _autocast(dev: torch.device, precision: str):
    if precision == "bfloat16":
        return torch.autocast(dev.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def interleaved_ratio(fns: dict, dev: torch.device, repeats: int) -> tuple[None, str]:
    """Interleaved medians of the arms' steps and their ratio, as a measured row's value."""
    for _ in range(2):
        for fn in fns.values():
            time_sample(fn, dev)
    times = {arm: [] for arm in fns}
    for _ in range(repeats):
        for arm, fn in fns.items():
            times[arm].append(time_sample(fn, dev))
    med = {arm: statistics.median(t) for arm, t in times.items()}
    return None, f"{med['invariant'] / med['stock']:.3f}x ({med['stock']:.2f} ms stock, {med['invariant']:.2f} ms invariant)"


def invariance_rows(table, dev: torch.device, small: bool, repeats: int) -> None:
    """The eager rows: every backbone and step of :data:`EAGER`, B = 8 and 32 (8 only with
    ``small``), float32 and bfloat16."""
    for name, steps in EAGER:
        axes = MODELS[name][1]
        for step in steps:
            for b in (8,) if small else (8, 32):
                for precision in ("float32", "bfloat16"):
                    def run(name=name, step=step, b=b, precision=precision, axes=axes):
                        models = _pair(name, step, dev)
                        batch = random_batch(b, axes, sides=SIDES[axes]).to(dev)
                        with _autocast(dev, precision):
                            fns = {arm: step_fn(m, batch, "train" if step in ("frozen", "packed") else step)
                                   for arm, m in models.items()}
                            return interleaved_ratio(fns, dev, repeats)

                    crit = (f"median of {repeats} interleaved; items {SIDES[axes][0]}-{SIDES[axes][1]} per side; "
                            "target <= 1.5x (packed: <= 1.15x the valid share)")
                    table.check("invariance cost", f"{name} {step}, B = {b}, {precision}", crit, run)


def compiled_rows(table, dev: torch.device, repeats: int) -> None:
    """The compiled rows (:data:`COMPILED`): stock and invariant each compiled once, B = 8."""
    for name, step in COMPILED:
        axes = MODELS[name][1]
        for precision in ("float32", "bfloat16"):
            def run(name=name, step=step, precision=precision, axes=axes):
                torch._dynamo.reset()
                models = {arm: torch.compile(m) for arm, m in _pair(name, step, dev).items()}
                batch = random_batch(8, axes, sides=SIDES[axes]).to(dev)
                t0 = time.perf_counter()
                with _autocast(dev, precision):
                    fns = {arm: step_fn(m, batch, step) for arm, m in models.items()}
                    for fn in fns.values():
                        fn()
                    compile_s = time.perf_counter() - t0
                    _, value = interleaved_ratio(fns, dev, repeats)
                return None, f"{value}; both compiled in {compile_s:.0f} s"

            crit = f"torch.compile default mode, B = 8, median of {repeats} interleaved; target <= 1.10x"
            table.check("invariance cost, compiled", f"{name} {step}, {precision}", crit, run)


def _captured(fn, dev: torch.device):
    """``fn`` (a training step) captured in a CUDA graph after three warm calls; the graph's replay."""
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(dev).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graphed_rows(table, dev: torch.device, repeats: int) -> None:
    """The CUDA-graph rows (:data:`GRAPHED`): each arm's training step captured, B = 8 and 32."""
    for name, step in GRAPHED:
        axes = MODELS[name][1]
        for b in (8, 32):
            for precision in ("float32", "bfloat16"):
                def run(name=name, step=step, b=b, precision=precision, axes=axes):
                    models = _pair(name, step, dev)
                    batch = random_batch(b, axes, sides=SIDES[axes]).to(dev)
                    with _autocast(dev, precision):
                        fns = {arm: _graph_step(m, batch, dev) for arm, m in models.items()}
                        return interleaved_ratio(fns, dev, repeats)

                crit = f"CUDA graph of the training step, median of {repeats} interleaved replays"
                table.check("invariance cost, CUDA graph", f"{name} {step}, B = {b}, {precision}", crit, run)


def _graph_step(model: torch.nn.Module, batch, dev: torch.device):
    """The replay of ``model``'s training step on ``batch`` (gradients accumulated, not zeroed: the
    graph keeps its buffers)."""
    model.train()

    def step():  # count_launches.step_fn's training step, without zeroing the gradients
        sum(level.tensors.float().mean() for level in model(batch)).backward()

    return _captured(step, dev)
