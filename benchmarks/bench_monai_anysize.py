"""MONAI's ViT on volumes of three sizes: vispos' padded batch against the per-item loop.

Three ways to get every item's ViT output at its own size (the same numbers, checked here):

* ``monai loop``: what users do by hand today (MONAI issue 6264): one MONAI ``ViT`` per size, its
  learned table resampled for that size, items run one at a time;
* ``vispos loop``: ``AnySizeViT`` on each item alone (its overhead over MONAI's own forward);
* ``vispos batch``: ``AnySizeViT`` on the padded ``NestedTensor`` of the three items (padded
  patches masked out of attention).

Reported: the median time per step of each (interleaved repeats, so load from other processes
spreads over all three), and each one's ratio to ``monai loop``. Forward only, ``no_grad``,
float32, default threads.

    PYTHONPATH=$PWD python benchmarks/bench_monai_anysize.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from monai.networks.nets import ViT

    from vispos import nested_tensor_from_tensor_list, resample_abs_pos_embed
    from vispos.monai import AnySizeViT

    torch.manual_seed(0)
    kw = dict(in_channels=1, img_size=(64, 64, 64), patch_size=16, hidden_size=args.hidden,
              mlp_dim=4 * args.hidden, num_layers=args.layers, num_heads=args.hidden // 64)
    net = AnySizeViT(**kw).eval()
    sizes = [(64, 64, 64), (96, 64, 48), (48, 80, 32)]
    items = [torch.randn(1, *s) for s in sizes]
    batch = nested_tensor_from_tensor_list(items)
    per_size = []
    for s in sizes:
        vit = ViT(**{**kw, "img_size": s}).eval()
        state = net.state_dict()
        grid = tuple(v // 16 for v in s)
        state["patch_embedding.position_embeddings"] = resample_abs_pos_embed(
            state["patch_embedding.position_embeddings"], grid, (4, 4, 4), num_prefix_tokens=0, mode="trilinear"
        )
        vit.load_state_dict(state)
        per_size.append(vit)

    def monai_loop():
        return [vit(x[None])[0] for vit, x in zip(per_size, items)]

    def vispos_loop():
        return [net(x[None])[0] for x in items]

    def vispos_batch():
        return net(batch)[0]

    with torch.no_grad():
        a, b, c = monai_loop(), vispos_loop(), vispos_batch()
        grid = [s // 16 for s in batch.tensors.shape[2:]]
        for i, s in enumerate(sizes):
            g = [v // 16 for v in s]
            torch.testing.assert_close(b[i], a[i])
            inside = c[i].reshape(*grid, -1)[: g[0], : g[1], : g[2]].reshape(1, -1, args.hidden)
            torch.testing.assert_close(inside, a[i], rtol=1e-4, atol=1e-4)
        arms = {"monai loop": monai_loop, "vispos loop": vispos_loop, "vispos batch": vispos_batch}
        times: dict[str, list[float]] = {k: [] for k in arms}
        for _ in range(args.repeats):
            for name, fn in arms.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["monai loop"])
    print(f"ViT hidden {args.hidden}, {args.layers} layers, patch 16; volumes {sizes}; "
          f"padded batch {tuple(batch.tensors.shape)}; threads {torch.get_num_threads()}")
    print("| arm | median ms | ratio to monai loop |")
    print("|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {1000 * med:.1f} | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
