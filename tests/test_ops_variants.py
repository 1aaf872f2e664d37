"""Each fused kernel compiles a handful of variants, not one per size: over 100 random ResNet-50-like
batches (B 1-32, sides 64-1024, channels first and channels last), counted with Triton's own binder
on meta tensors (``benchmarks/host_overhead.py``'s ``kernel_variants``); and the host-overhead
benchmark's quick run writes every key its JSON promises."""

import json

import pytest

pytest.importorskip("triton")
host_overhead = pytest.importorskip("benchmarks.host_overhead")

from vispos.ops import _batch_norm_kernels, _triton  # noqa: E402


def test_each_norm_kernel_compiles_at_most_four_variants():
    variants = host_overhead.kernel_variants(host_overhead.random_batches(100))
    assert set(variants) == {"_bn_stats", "_bn_apply", "_bn_grad_sums", "_bn_grad_apply", "_gn_stats", "_gn_apply",
                             "_gn_grad_sums", "_gn_grad_apply"}
    assert max(variants.values()) <= 4, variants


def test_the_count_sees_specialized_sizes(monkeypatch):
    """The same kernel without ``do_not_specialize`` asks for a variant per size class (Triton
    specializes integers equal to 1 and multiples of 16): the count catches it."""
    plain = _triton.kernel()(_batch_norm_kernels._bn_stats.fn)
    monkeypatch.setattr(_batch_norm_kernels, "_bn_stats", plain)
    variants = host_overhead.kernel_variants(host_overhead.random_batches(30))
    assert variants["_bn_stats"] > 4, variants


def test_quick_run_writes_every_key(tmp_path, monkeypatch):
    monkeypatch.setattr(host_overhead, "random_batches", lambda count, seed=0: [(2, 64, 96, False), (3, 80, 64, True)])
    path = tmp_path / "host.json"
    out = tmp_path / "host.md"
    assert host_overhead.main(["--quick", "--json", str(path), "--out", str(out)]) == 0
    rows = json.loads(path.read_text())
    for key in host_overhead.KEYS:
        assert isinstance(rows[key], (int, float)) and rows[key] > 0, key
    assert rows["kernel_variants_max"] <= 4
    text = out.read_text()
    assert all(f"| {key} |" in text for key in host_overhead.KEYS)
