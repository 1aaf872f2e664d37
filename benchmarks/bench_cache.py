"""What the encoders' cache holds and what a hit costs (issue 11).

Two passes, each in its own process so that one does not disturb the other's memory:

* ``memory``: one ``PositionEmbeddingSine(128, normalize=True)`` with its default cache is fed
  100 padded batches of two stride-4 feature maps of random sizes (24 to 117 MiB of embedding
  each), as a training loop with multi-scale augmentation does. Reported: the process's resident
  memory (RSS) before the loop and after it (results dropped, ``gc.collect()``), and the bytes
  the cache's entries hold, counted from their storages. Default allocator, no ``mallopt``.
* ``time``: the cost of one call in the steady state, median over interleaved repeats (each
  repeat times every variant in turn, so load from other processes spreads over all of them):

  - ``floor``: allocate the output and fill it once (``torch.empty(shape).fill_(1)``), the
    least any call that returns a tensor of its own can do;
  - ``miss``: a module with ``cache_size=0`` (computes every time);
  - ``hit``: the default module, same input again (on this branch: a copy out of the cache);
  - ``hit zero_copy``: ``zero_copy=True`` (shared, read-only result; this branch only).

  Cases: DETR C5 (4 images ~800x1333, stride 32, 256 channels, normalize, a NestedTensor with
  rectangular padding; 4.1 MiB) and an unmasked ``PositionalEncodingPermute2D(256)`` map of the
  same size (B = 4).

Run from the repository root (``PYTHONPATH`` picks the checkout to measure)::

    PYTHONPATH=$PWD python benchmarks/bench_cache.py [--repeats 31] [--steps 100]

The script works on older checkouts too (it only uses what they have).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cache_bytes(module) -> int:
    """Bytes held by a module's cache entries, from their storages (any version of the cache)."""
    cache = module._cache if hasattr(module, "_cache") else module._tables
    total = 0
    for entry in list(cache._entries.values()):
        tensors = (entry.tensor, entry.content) if hasattr(entry, "tensor") else (entry[0], entry[2])
        total += sum(t.untyped_storage().nbytes() for t in tensors if t is not None)
    return total


def memory_pass(steps: int, seed: int, cache: bool = True) -> dict:
    import torch

    import vispos

    torch.set_num_threads(1)
    rng = random.Random(seed)
    # cache=False: the same loop with cache_size=0, i.e. what the allocator alone keeps
    pe = vispos.PositionEmbeddingSine(128, normalize=True, **({} if cache else {"cache_size": 0}))
    # warm-up: the allocator's and torch's own first-use memory is not the cache's
    warm = vispos.nested_tensor_from_tensor_list([torch.zeros(1, 96, 128), torch.zeros(1, 90, 120)])
    pe(warm)
    pe.clear_cache()
    del warm
    gc.collect()
    before = _rss_mib()
    peak_cache = 0
    for _ in range(steps):
        sizes = [(rng.randint(60, 200), rng.randint(80, 300)) for _ in range(2)]
        # stride-4 maps of the padded batch: a NestedTensor as a backbone level gives it
        maps = [torch.zeros(1, h, w) for h, w in sizes]
        batch = vispos.nested_tensor_from_tensor_list(maps)
        out = pe(batch)
        del out, batch, maps
        peak_cache = max(peak_cache, _cache_bytes(pe))
    gc.collect()
    after = _rss_mib()
    return {
        "rss_before_mib": before,
        "rss_after_mib": after,
        "held_mib": after - before,
        "cache_entries": len(pe._cache),
        "cache_mib": _cache_bytes(pe) / 2**20,
        "cache_peak_mib": peak_cache / 2**20,
    }


def _c5_batch(torch, vispos):
    sizes = [(800, 1333), (800, 1200), (640, 1333), (704, 1056)]
    level = [torch.zeros(1, -(-h // 32), -(-w // 32)) for h, w in sizes]
    return vispos.nested_tensor_from_tensor_list(level)


def time_pass(repeats: int, inner: int) -> dict:
    import inspect

    import torch

    import vispos

    torch.set_num_threads(1)
    has_zero_copy = "zero_copy" in inspect.signature(vispos.PositionEmbeddingSine).parameters
    results: dict[str, dict[str, list[float]]] = {}

    nt = _c5_batch(torch, vispos)
    c5_shape = (4, 256, *nt.mask.shape[1:])
    grid_in = torch.zeros(c5_shape)
    cases = {
        "DETR C5 sine (NestedTensor, 4.1 MiB)": (
            c5_shape,
            nt,
            lambda **k: vispos.PositionEmbeddingSine(128, normalize=True, **k),
        ),
        "PositionalEncodingPermute2D (no mask, B=4)": (
            c5_shape,
            grid_in,
            lambda **k: vispos.PositionalEncodingPermute2D(256, **k),
        ),
    }
    for name, (shape, x, make) in cases.items():
        variants = {"floor (alloc + fill)": lambda s=shape: torch.empty(s).fill_(1.0)}
        miss = make(cache_size=0) if "sine" in name else make(cache=False)
        variants["miss (no cache)"] = lambda m=miss, x=x: m(x)
        hit = make()
        variants["hit (default)"] = lambda m=hit, x=x: m(x)
        if has_zero_copy:
            shared = make(zero_copy=True)
            variants["hit (zero_copy=True)"] = lambda m=shared, x=x: m(x)
        for fn in variants.values():  # warm-up; fills the caches
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(repeats):
            for v, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(inner):
                    out = fn()
                t1 = time.perf_counter()
                del out
                times[v].append((t1 - t0) / inner * 1e3)
        results[name] = times
    return {"medians_ms": {c: {v: statistics.median(t) for v, t in r.items()} for c, r in results.items()},
            "iqr_ms": {c: {v: _iqr(t) for v, t in r.items()} for c, r in results.items()},
            "repeats": repeats, "inner": inner, "zero_copy": has_zero_copy}


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def _child(pass_name: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", pass_name, "--repeats", str(args.repeats),
           "--inner", str(args.inner), "--steps", str(args.steps), "--seed", str(args.seed)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ.copy())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--inner", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", choices=("memory", "memory-nocache", "time"))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.child in ("memory", "memory-nocache"):
        print(json.dumps(memory_pass(args.steps, args.seed, cache=args.child == "memory")))
        return
    if args.child == "time":
        print(json.dumps(time_pass(args.repeats, args.inner)))
        return

    import vispos

    mem = _child("memory", args)
    base = _child("memory-nocache", args)
    tim = _child("time", args)
    print(f"vispos from {os.path.dirname(vispos.__file__)}")
    print(f"\n**Memory: {args.steps} batches of two stride-4 maps of random sizes (one module)**\n")
    print("| module | RSS before MiB | RSS after MiB | held MiB | cache entries | cache MiB (end) "
          "| cache MiB (peak) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, m in (("default cache", mem), ("cache_size=0 (allocator alone)", base)):
        print(f"| {label} | {m['rss_before_mib']:.0f} | {m['rss_after_mib']:.0f} | "
              f"{m['held_mib']:.1f} | {m['cache_entries']} | {m['cache_mib']:.2f} | "
              f"{m['cache_peak_mib']:.2f} |")
    print(f"\n**Cost of one call, median of {tim['repeats']} interleaved repeats "
          f"(x {tim['inner']} calls), 1 thread**")
    for case, med in tim["medians_ms"].items():
        floor = med["floor (alloc + fill)"]
        print(f"\n{case}\n\n| variant | median ms | IQR ms | x floor |\n|---|---:|---:|---:|")
        for variant, ms in med.items():
            print(f"| {variant} | {ms:.3f} | {tim['iqr_ms'][case][variant]:.3f} | {ms / floor:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"memory": mem, "memory_nocache": base, "time": tim}, f, indent=2)


if __name__ == "__main__":
    main()
