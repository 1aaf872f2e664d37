"""What ``packed=True`` saves: a ViT on a batch of COCO-like images, stock vs padded-invariant vs packed.

The batch: ``--batch`` (8) images with COCO-like shapes, aspect ratio (width / height) log-uniform
in [0.5, 2] and long side uniform in [320, 640] pixels (seeded), padded at the origin to the
largest height and width (DETR's canvas). Three arms hold the same weights: the stock backbone on
the padded canvas (every token of the canvas runs), ``padding_invariant=True`` (the same canvas,
each item's own positions and an attention mask) and ``packed=True`` (only the items' own tokens,
attention per item). Each in eval mode (forward under ``no_grad``) and training mode (forward +
backward of the levels' sum over valid cells), interleaved round-robin in one process (the arm
order rotates every round, so load from other processes falls on all alike), ``--warmup`` untimed
calls each, medians over ``--repeats`` rounds of wall and CPU seconds (``time.process_time``: on
one thread, what a quiet machine would show).

Reported beside the times: the padded fraction of the canvas (pixels, and patch tokens), and the
packed cost against the target, ``packed / (valid-token share x stock) <= 1.15``: the share is
``sum(P + h_b w_b) / (B (P + gh gw))`` (``P`` prefix tokens, ``h_b x w_b`` item ``b``'s grid,
``gh x gw`` the canvas's).

``--attention`` adds the measurement that chose the packed mode's block-diagonal attention, on the
same batch's token counts (the first workload's heads: ViT-Ti's 3 of 64): the per-item SDPA call packed mode uses,
SDPA on the whole packed sequence with a block-diagonal boolean mask, FlexAttention with a
document mask (eager, and compiled with ``torch.compile``), and nested jagged tensors
(``torch.nested``, ``layout=torch.jagged``) through SDPA.

    OMP_NUM_THREADS=1 python benchmarks/bench_packed.py --threads 1 --repeats 5 --attention \\
        --out benchmarks/results_packed.md
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import vispos  # noqa: E402
from vispos.backbones import TimmBackbone  # noqa: E402

ARMS = ("stock", "padded-invariant", "packed")
MODES = ("eval forward", "train forward+backward")
TARGET = 1.15

#: workload -> (timm name, model_kwargs): timm's ViT-Ti/16 (12 blocks of width 192, learned table,
#: class token) and a DINOv3 ViT-S/16 cut to ViT-Ti width and 6 blocks (RoPE, class and 4 register
#: tokens, layer scale), sized for a 2-core CPU
WORKLOADS = {
    "vit_tiny": ("vit_tiny_patch16_224", {}),
    "dinov3_tiny_d6": ("vit_small_patch16_dinov3", {"embed_dim": 192, "num_heads": 3, "depth": 6}),
}


def coco_like_sizes(batch: int, seed: int = 0, long_side=(320, 640), aspect=(0.5, 2.0)) -> list[tuple[int, int]]:
    """``batch`` image sizes ``(H, W)``: aspect ratio W / H log-uniform in ``aspect``, long side
    uniform in ``long_side``."""
    g = torch.Generator().manual_seed(seed)
    sizes = []
    for _ in range(batch):
        u, v = torch.rand(2, generator=g, dtype=torch.float64).tolist()
        ratio = math.exp(math.log(aspect[0]) + u * (math.log(aspect[1]) - math.log(aspect[0])))
        side = round(long_side[0] + v * (long_side[1] - long_side[0]))
        short = max(1, round(side / ratio if ratio > 1 else side * ratio))
        sizes.append((short, side) if ratio > 1 else (side, short))
    return sizes


def build(workload: str, out_indices=(-1,)):
    """The three arms (same weights) of ``workload``."""
    name, kwargs = WORKLOADS[workload]
    torch.manual_seed(0)
    stock = TimmBackbone(name, out_indices=out_indices, model_kwargs=kwargs)
    arms = {"stock": stock}
    for arm, flags in (("padded-invariant", {"padding_invariant": True}), ("packed", {"packed": True})):
        model = TimmBackbone(name, out_indices=out_indices, model_kwargs=kwargs, **flags)
        model.load_state_dict(stock.state_dict())
        arms[arm] = model
    return arms


def shares(model: torch.nn.Module, sizes, canvas) -> dict[str, float]:
    """Padded fraction of the canvas (pixels, patch tokens) and the valid-token share."""
    timm_model = model.body.model
    pe, prefix = timm_model.patch_embed, timm_model.num_prefix_tokens
    grids = [pe.dynamic_feat_size(s) for s in sizes]
    gh, gw = pe.dynamic_feat_size(canvas)
    pixels = sum(h * w for h, w in sizes) / (len(sizes) * canvas[0] * canvas[1])
    patches = sum(h * w for h, w in grids) / (len(sizes) * gh * gw)
    tokens = sum(prefix + h * w for h, w in grids) / (len(sizes) * (prefix + gh * gw))
    return {"padded_pixels": 1 - pixels, "padded_tokens": 1 - patches, "valid_token_share": tokens,
            "tokens": sum(prefix + h * w for h, w in grids), "canvas_tokens": len(sizes) * (prefix + gh * gw)}


def step(model: torch.nn.Module, batch, mode: str) -> None:
    if mode == "eval forward":
        model.eval()
        with torch.no_grad():
            model(batch)
        return
    model.train()
    model.zero_grad(set_to_none=True)
    loss = 0.0
    for level in model(batch):
        valid = level.tensors if level.mask is None else level.tensors.masked_fill(level.mask[:, None], 0)
        loss = loss + valid.sum()
    loss.backward()


def time_arms(arms, batch, repeats: int, warmup: int) -> dict:
    """``{(mode, arm): {"wall": median s, "cpu": median s}}``, arms interleaved round-robin."""
    out = {}
    for mode in MODES:
        for arm in ARMS:
            for _ in range(warmup):
                step(arms[arm], batch, mode)
        samples = {arm: ([], []) for arm in ARMS}
        for r in range(repeats):
            order = ARMS[r % len(ARMS):] + ARMS[: r % len(ARMS)]
            for arm in order:
                t0, c0 = time.perf_counter(), time.process_time()
                step(arms[arm], batch, mode)
                samples[arm][0].append(time.perf_counter() - t0)
                samples[arm][1].append(time.process_time() - c0)
        for arm, (wall, cpu) in samples.items():
            out[mode, arm] = {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}
    return out


# ----------------------------------------------------------------------------- attention choice
def attention_rows(lengths: list[int], heads: int = 3, head_dim: int = 64, repeats: int = 3,
                   names=None) -> list[tuple]:
    """Block-diagonal attention over ``lengths`` tokens: ``[(name, max |err|, fwd s, fwd+bwd s or a
    note)]``, medians; errors against the per-item SDPA. ``names``: only these rows (and the
    per-item SDPA)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(0)
    total = sum(lengths)
    q, k, v = (torch.randn(1, heads, total, head_dim, generator=g) for _ in range(3))
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())

    def per_item(q, k, v):
        return torch.cat([F.scaled_dot_product_attention(a, b, c) for a, b, c in
                          zip(*(t.split(lengths, dim=2) for t in (q, k, v)))], dim=2)

    keep = seg[:, None] == seg[None, :]

    def block_mask(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    def document(b, h, qi, ki):
        return seg[qi] == seg[ki]

    flex_mask = create_block_mask(document, None, None, total, total, device="cpu")
    compiled = torch.compile(flex_attention)

    def flex_eager(q, k, v):
        return flex_attention(q, k, v, block_mask=flex_mask)

    def flex_compiled(q, k, v):
        return compiled(q, k, v, block_mask=flex_mask)

    def jagged(q, k, v):
        nts = [torch.nested.nested_tensor_from_jagged(t[0].transpose(0, 1).contiguous(), offsets=offsets)
               .transpose(1, 2) for t in (q, k, v)]
        return F.scaled_dot_product_attention(*nts).transpose(1, 2).values().transpose(0, 1)[None]

    impls = {"per-item SDPA (packed mode)": per_item, "SDPA, block-diagonal bool mask": block_mask,
             "FlexAttention document mask, eager": flex_eager,
             "FlexAttention document mask, torch.compile": flex_compiled,
             "nested jagged tensors + SDPA": jagged}
    with torch.no_grad():
        ref = per_item(q, k, v)
    rows = []
    for name, fn in impls.items():
        if names is not None and name not in names and fn is not per_item:
            continue
        with torch.no_grad():
            err = float((fn(q, k, v) - ref).abs().max())  # also the warm-up (and compilation)
        fwd, both, note = [], [], None
        for _ in range(repeats):
            with torch.no_grad():
                t0 = time.perf_counter()
                fn(q, k, v)
                fwd.append(time.perf_counter() - t0)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            try:
                t0 = time.perf_counter()
                fn(*leaves).sum().backward()
                both.append(time.perf_counter() - t0)
            except (NotImplementedError, RuntimeError) as exc:
                note = str(exc).splitlines()[0][:90]
        rows.append((name, err, statistics.median(fwd), statistics.median(both) if both else note))
    return rows


# ----------------------------------------------------------------------------- report
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--attention", action="store_true", help="also time the block-diagonal attention choices")
    parser.add_argument("--attention-repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the markdown report here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = coco_like_sizes(args.batch)
    canvas = (max(h for h, _ in sizes), max(w for _, w in sizes))
    g = torch.Generator().manual_seed(1)
    batch = vispos.nested_tensor_from_tensor_list([torch.randn(3, h, w, generator=g) for h, w in sizes])
    lines = [
        f"torch {torch.__version__}, timm {__import__('timm').__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} thread(s), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
        f"load average {os.getloadavg()[0]:.1f} at the start; {args.repeats} interleaved rounds after {args.warmup} "
        "warm-up call(s) per arm, medians",
        "",
        f"Batch: {args.batch} images (H x W) {', '.join(f'{h}x{w}' for h, w in sizes)}; canvas {canvas[0]}x{canvas[1]}",
        "",
        "| backbone | mode | padded pixels | padded tokens | valid-token share | stock s | padded-invariant s | "
        "packed s | packed / stock | packed / (share x stock) | target 1.15 | stock CPU s | packed CPU s | "
        "CPU: packed / (share x stock) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for workload in args.workloads:
        arms = build(workload)
        share = shares(arms["stock"], sizes, canvas)
        print(f"{workload}: {share}", flush=True)
        times = time_arms(arms, batch, args.repeats, args.warmup)
        for mode in MODES:
            stock, inv, packed = (times[mode, arm] for arm in ARMS)
            ratio = packed["wall"] / (share["valid_token_share"] * stock["wall"])
            cpu_ratio = packed["cpu"] / (share["valid_token_share"] * stock["cpu"])
            row = (f"| {workload} | {mode} | {share['padded_pixels']:.1%} | {share['padded_tokens']:.1%} | "
                   f"{share['valid_token_share']:.3f} | {stock['wall']:.3f} | {inv['wall']:.3f} | {packed['wall']:.3f} | "
                   f"{packed['wall'] / stock['wall']:.3f} | {ratio:.3f} | {'met' if ratio <= TARGET else 'missed'} | "
                   f"{stock['cpu']:.3f} | {packed['cpu']:.3f} | {cpu_ratio:.3f} |")
            print(row, flush=True)
            lines.append(row)
    if args.attention:
        timm_model = build(args.workloads[0])["packed"].body.model
        lengths = [timm_model.num_prefix_tokens + h * w for h, w in
                   (timm_model.patch_embed.dynamic_feat_size(s) for s in sizes)]
        attn = timm_model.blocks[0].attn
        lines += ["", f"Block-diagonal attention over this batch's {sum(lengths)} tokens ({lengths}), "
                  f"{attn.num_heads} heads of {attn.head_dim}, "
                  f"one call (all heads, one block), medians of {args.attention_repeats}; max |err| against the "
                  "per-item SDPA, float32", "",
                  "| attention | max abs err | forward s | forward+backward s |", "|---|---:|---:|---|"]
        for name, err, fwd, both in attention_rows(lengths, attn.num_heads, attn.head_dim, args.attention_repeats):
            both_text = f"{both:.3f}" if isinstance(both, float) else f"fails: {both}"
            row = f"| {name} | {err:.1e} | {fwd:.3f} | {both_text} |"
            print(row, flush=True)
            lines.append(row)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
