"""Host cost of vispos' fused ops: vispos' Python per call on the GPU code path, and the compiled
variants each kernel asks for.

Run (about a minute; ``--quick``: a few seconds):

    python benchmarks/host_overhead.py --json host.json --out benchmarks/results_host_overhead.md

On a GPU the device waits for the host: every op's Python runs before its kernels start. This
measures that Python on the CPU, with the code path CUDA takes chosen (``vispos.ops._triton``'s
interpreted mode routes CPU tensors to the Triton launchers) and every Triton launch replaced by a
no-op, and the host-side shortcuts of CPU tensors off (as for CUDA tensors), so only vispos' own
Python is timed, beside torch's own op on the same tensors and
``torch.add`` on one element (the machine's dispatcher cost: the issue's figures were taken where
it cost 1.2 us). Rows (the ``--json`` keys):

* ``bn_forward_us`` / ``bn_forward_backward_us``: ``cells._norms.batch_norm`` (the call the
  rewriter makes) in training, running statistics, affine, on a 2x64x8x8 map padded by boxes;
  forward, then forward and backward through autograd;
* ``gn_forward_us``: ``cells._norms.group_norm`` (32 groups) on the same map;
* ``sine_c5_nested_us`` / ``sine_c5_mask_us``: ``PositionEmbeddingSine(128, normalize=True,
  cache_size=0)`` (the miss path) on DETR's C5 of three photos (800x1066, 736x1333, 800x1201 at
  stride 32), through a ``NestedTensor`` and through its bool mask;
* ``resnet50_train_step_host_ratio``: one training step (forward, backward) of the invariant
  network over the stock one, B = 8, on ResNet-50's graph (its 53 batch norms, convolutions and
  blocks) at 1/16 of its channels and 64 px images, so that the CPU's compute is small beside the
  host's work; both steps run their torch ops on the CPU (the stock one computes its batch norms,
  the invariant one's batch-norm kernels are the no-op launches): a proxy of the ratio of host
  times on a GPU, not a GPU measurement;
* ``kernel_variants_max``: the most compiled variants any norm kernel asks for over 100 random
  ResNet-50-like batches (B 1-32, sides 64-1024, channels first and channels last; every level's
  batch norm forward and backward, group norm with 32 groups), counted with Triton's own binder
  (:func:`vispos.ops._triton.variant_key`) on meta tensors: no GPU and no compilation needed.

Every time is the best of several rounds of many calls, in the thread's CPU time (the machine may
be shared: time spent waiting for a core does not count); the two ResNet steps take turns in every
round (21 rounds of 2 steps each), as do the norm rows, torch's own ops and ``torch.add`` (7 rounds)
and the two sine rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import vispos  # noqa: E402
import vispos._sincos  # noqa: E402
import vispos._tracing  # noqa: E402
from vispos import Padding, PositionEmbeddingSine  # noqa: E402
from vispos.invariance.cells import _norms as norms  # noqa: E402
from vispos.ops import _batch_norm_kernels as bn_kernels  # noqa: E402
from vispos.ops import _group_norm_kernels as gn_kernels  # noqa: E402
from vispos.ops import _triton  # noqa: E402

KEYS = ("bn_forward_us", "bn_forward_backward_us", "gn_forward_us", "sine_c5_nested_us", "sine_c5_mask_us",
        "resnet50_train_step_host_ratio", "kernel_variants_max")
TARGETS = {"bn_forward_us": 25.0, "bn_forward_backward_us": 60.0, "gn_forward_us": 25.0, "sine_c5_nested_us": 40.0,
           "sine_c5_mask_us": 40.0, "resnet50_train_step_host_ratio": 1.2, "kernel_variants_max": 4}
C5_IMAGES = [(800, 1066), (736, 1333), (800, 1201)]
#: ResNet-50's levels: (stride, channels of its batch norms)
RESNET50_LEVELS = ((2, (64,)), (4, (64, 256)), (8, (128, 512)), (16, (256, 1024)), (32, (512, 2048)))


@contextlib.contextmanager
def stubbed_launches():
    """The code CUDA runs, on the CPU: the ops' Triton path with every launch a no-op, and no
    host-side shortcut (``host_side`` answers False, as for a CUDA tensor: no mask read on the host)."""
    original = _triton._Kernel.__getitem__
    _triton._Kernel.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)
    switches = [m for m in (vispos._sincos, vispos._tracing) if hasattr(m, "host_side")]
    saved = [m.host_side for m in switches]
    for m in switches:
        m.host_side = lambda device: False
    flush = torch.set_flush_denormal(True)  # the stubbed kernels' outputs are uninitialised memory: a
    try:  # denormal there would slow the next convolution down, a cost no GPU step has
        with _triton.interpreted():
            yield
    finally:
        _triton._Kernel.__getitem__ = original
        for m, f in zip(switches, saved):
            m.host_side = f
        if flush:
            torch.set_flush_denormal(False)


def per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    """The best over ``rounds`` of the mean time of ``calls`` calls, in microseconds: this thread's
    CPU time (``time.thread_time``), so that other processes on a shared machine do not count."""
    for _ in range(min(calls, 20)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best * 1e6


def interleaved_best(arms: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, float]:
    """Each arm's best over ``rounds`` of the mean time of ``calls`` calls, in microseconds of this
    thread's CPU time, the arms taking turns within every round (a machine that slows down for a
    while slows both arms alike)."""
    for fn in arms.values():
        for _ in range(2):
            fn()
    best = dict.fromkeys(arms, float("inf"))
    for _ in range(rounds):
        for arm, fn in arms.items():
            start = time.thread_time()
            for _ in range(calls):
                fn()
            best[arm] = min(best[arm], (time.thread_time() - start) / calls)
    return {arm: t * 1e6 for arm, t in best.items()}


def norm_rows(calls: int, rounds: int) -> dict[str, float]:
    """The norms' rows and torch's batch norm on the same map (see the module doc)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 8, 8, generator=g)
    padding = Padding.from_sizes([(8, 8), (5, 6)], (8, 8))
    rm, rv, tracked = torch.zeros(64), torch.ones(64), torch.tensor(0)
    w, b = torch.rand(64, generator=g) + 0.5, torch.randn(64, generator=g)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    dy = torch.randn(x.shape, generator=g)

    def forward_backward():
        norms.batch_norm(xg, padding, rm, rv, wg, bg, True, 0.1, 1e-5, tracked).backward(dy)

    one = torch.ones(1)
    stubbed = {
        "bn_forward_us": (lambda: norms.batch_norm(x, padding, rm, rv, w, b, True, 0.1, 1e-5, tracked), calls),
        "bn_forward_backward_us": (forward_backward, max(calls // 3, 1)),
        "gn_forward_us": (lambda: norms.group_norm(x, padding, 32, w, b, 1e-5), calls),
    }
    stock = {
        "torch_bn_forward_us": (lambda: F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5), calls),
        "torch_bn_forward_backward_us": (
            lambda: F.batch_norm(xg, rm, rv, wg, bg, True, 0.1, 1e-5).backward(dy), max(calls // 3, 1)),
        "torch_add_us": (lambda: torch.add(one, 1), calls * 3),
    }
    rows = {}
    for _ in range(rounds):  # the rows take turns, so that a slow spell of the machine slows them all
        with stubbed_launches():
            for key, (fn, n) in stubbed.items():
                rows[key] = min(rows.get(key, float("inf")), per_call_us(fn, n, 1))
        for key, (fn, n) in stock.items():
            rows[key] = min(rows.get(key, float("inf")), per_call_us(fn, n, 1))
    return rows


def sine_rows(calls: int, rounds: int) -> dict[str, float]:
    """DETR's C5 through the sine embedding's miss path, a NestedTensor and its bool mask."""
    features = [torch.zeros(8, -(-h // 32), -(-w // 32)) for h, w in C5_IMAGES]
    nested = vispos.nested_tensor_from_tensor_list(features)
    mask = nested.mask.clone()
    pe = PositionEmbeddingSine(128, normalize=True, cache_size=0)
    with stubbed_launches():
        return interleaved_best({"sine_c5_nested_us": lambda: pe(nested),
                                 "sine_c5_mask_us": lambda: pe(nested.tensors, mask)}, calls, rounds)


class SlimResNet50(nn.Module):
    """ResNet-50's graph (torchvision's Bottleneck blocks, 3-4-6-3, its 53 batch norms) at
    ``1 / 16`` of its channels: the same ops and layers, little compute."""

    def __init__(self, width: int = 4, num_classes: int = 10) -> None:
        from torchvision.models.resnet import Bottleneck, ResNet

        super().__init__()
        net = ResNet.__new__(ResNet)
        nn.Module.__init__(net)
        net._norm_layer, net.inplanes, net.dilation, net.groups, net.base_width = nn.BatchNorm2d, width, 1, 1, 64
        net.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        net.bn1 = nn.BatchNorm2d(width)
        net.relu = nn.ReLU(inplace=True)
        net.maxpool = nn.MaxPool2d(3, 2, 1)
        for i, (blocks, stride) in enumerate(((3, 1), (4, 2), (6, 2), (3, 2))):
            setattr(net, f"layer{i + 1}", net._make_layer(Bottleneck, width << i, blocks, stride=stride))
        net.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        net.fc = nn.Linear(32 * width, num_classes)
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def resnet_ratio(batch: int, side: int, rounds: int) -> dict[str, float]:
    """The invariant / stock training step of :class:`SlimResNet50` (see the module doc)."""
    torch.manual_seed(0)
    net = SlimResNet50().train()
    inv = vispos.make_padding_invariant(net)
    g = torch.Generator().manual_seed(1)
    items = [torch.randn(3, side - 8 * (i % 3), side - 8 * (i % 2), generator=g) for i in range(batch)]
    nested = vispos.nested_tensor_from_tensor_list(items)
    steps = {"stock": lambda: net(nested.tensors).sum().backward(), "invariant": lambda: inv(nested).sum().backward()}
    with stubbed_launches():
        best = interleaved_best(steps, 2, rounds)
    return {"resnet50_train_step_host_ratio": best["invariant"] / best["stock"],
            "resnet50_stock_step_ms": best["stock"] / 1e3, "resnet50_invariant_step_ms": best["invariant"] / 1e3}


def random_batches(count: int, seed: int = 0):
    """``count`` random ResNet-50-like batches: ``(B, H, W, channels_last)``, B 1-32, sides 64-1024."""
    rng = random.Random(seed)
    return [(rng.randint(1, 32), rng.randint(64, 1024), rng.randint(64, 1024), rng.random() < 0.5)
            for _ in range(count)]


def kernel_variants(batches) -> dict[str, int]:
    """Distinct compiled variants each norm kernel asks for over ``batches`` (see the module doc):
    every level of ResNet-50 at each batch's sizes, batch norm forward (running statistics, affine)
    and backward (every gradient), group norm (32 groups) forward and backward."""
    seen: dict[str, set] = {}
    original = _triton._Kernel.__getitem__

    def record(self, grid):
        return lambda *args, **kwargs: seen.setdefault(self.__name__, set()).add(
            _triton.variant_key(self, *args, **kwargs))

    _triton._Kernel.__getitem__ = record
    meta = torch.device("meta")
    try:
        for b, h, w, last in batches:
            for stride, channels in RESNET50_LEVELS:
                for c in channels:
                    shape = (b, c, -(-h // stride), -(-w // stride))
                    x = torch.empty(shape, device=meta)
                    if last:
                        x = x.to(memory_format=torch.channels_last)
                    mask = torch.empty(b, 1, *shape[2:], dtype=torch.bool, device=meta)
                    vec = torch.empty(c, device=meta)
                    scalars = torch.empty(2, device=meta)
                    tracked = torch.empty((), dtype=torch.long, device=meta)
                    y, mean, invstd = bn_kernels.batch_norm_forward(x, vec, vec, mask, scalars, 0.1, vec.clone(),
                                                                    vec.clone(), tracked, True)
                    bn_kernels.batch_norm_backward(torch.empty_like(x), x, x, mask, vec, mean, invstd, True, True,
                                                   True, torch.float32)
                    mean, rstd = gn_kernels.group_norm_forward(y, x, vec, vec, mask, 32, scalars)
                    gn_kernels.group_norm_backward(torch.empty_like(x), x, x, mask, vec, mean, rstd, 32, True, True,
                                                   torch.float32)
    finally:
        _triton._Kernel.__getitem__ = original
    return {name: len(keys) for name, keys in sorted(seen.items())}


def measure(quick: bool, calls: int | None = None, rounds: int | None = None) -> dict:
    """Every row (``quick``: fewer calls, rounds and batches, a smaller ResNet step; ``calls`` and
    ``rounds`` override the defaults of the timed rows)."""
    calls, rounds = calls or (20 if quick else 400), rounds or (2 if quick else 7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the thread's CPU time is the call's: no work on other threads
    try:
        return _measure(quick, calls, rounds)
    finally:
        torch.set_num_threads(threads)


def _measure(quick: bool, calls: int, rounds: int) -> dict:
    out: dict = {}
    out.update(norm_rows(calls, rounds))
    out.update(sine_rows(calls, rounds))
    out.update(resnet_ratio(2, 64, 1) if quick else resnet_ratio(8, 64, 3 * rounds))
    variants = kernel_variants(random_batches(5 if quick else 100))
    out["kernel_variants"] = variants
    out["kernel_variants_max"] = max(variants.values())
    out["normalized_to_add_1.2us"] = {k: out[k] * 1.2 / out["torch_add_us"] for k in KEYS if k.endswith("_us")}
    return out


def table(rows: dict, quick: bool) -> str:
    add = rows["torch_add_us"]
    lines = [
        "# Host cost of vispos' fused ops", "",
        f"torch {torch.__version__}; {os.cpu_count()} cores, timed on one thread; "
        f"`python benchmarks/host_overhead.py{' --quick' if quick else ''}`. vispos' Python per call on the "
        "CUDA code path, launches replaced by a no-op (see the script's doc). `torch.add` on one element took "
        f"{add:.2f} us here; the normalized column scales every time to 1.2 us for it (where the targets were "
        "set).", "",
        "| row | measured | normalized to torch.add = 1.2 us | target | torch's own op |",
        "|---|---|---|---|---|",
    ]
    torch_ops = {"bn_forward_us": f"F.batch_norm in training, with its compute: {rows['torch_bn_forward_us']:.1f} us",
                 "bn_forward_backward_us": "F.batch_norm forward + backward, with their compute: "
                                           f"{rows['torch_bn_forward_backward_us']:.1f} us"}
    for key in KEYS:
        value, target = rows[key], TARGETS[key]
        if key.endswith("_us"):
            norm = rows["normalized_to_add_1.2us"][key]
            lines.append(f"| {key} | {value:.1f} us | {norm:.1f} us | <= {target:g} us | {torch_ops.get(key, '')} |")
        elif key == "resnet50_train_step_host_ratio":
            lines.append(f"| {key} | {value:.2f}x ({rows['resnet50_stock_step_ms']:.1f} ms stock, "
                         f"{rows['resnet50_invariant_step_ms']:.1f} ms invariant) | - | <= {target:g}x | |")
        else:
            detail = ", ".join(f"{k} {v}" for k, v in rows["kernel_variants"].items())
            lines.append(f"| {key} | {value} ({detail}) | - | <= {target} | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the rows here as JSON")
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="fewer calls, 5 batches for the variants")
    args = parser.parse_args(argv)
    rows = measure(args.quick)
    text = table(rows, args.quick)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
