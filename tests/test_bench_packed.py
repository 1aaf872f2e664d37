"""benchmarks/bench_packed.py measures what it says: COCO-like sizes in range, the shares of the
canvas, every arm's step runs, and the attention rows it compares agree with the per-item SDPA."""

import math

import pytest
import torch

bench = pytest.importorskip("benchmarks.bench_packed")


def test_coco_like_sizes_in_range():
    sizes = bench.coco_like_sizes(64, seed=3)
    assert len(sizes) == 64 and sizes == bench.coco_like_sizes(64, seed=3)
    for h, w in sizes:
        assert 320 <= max(h, w) <= 640
        assert 0.5 - 1e-2 <= w / h <= 2 + 1e-2
    ratios = [math.log(w / h) for h, w in sizes]
    assert min(ratios) < -0.2 and max(ratios) > 0.2  # both portrait and landscape drawn


def test_shares_and_arms_run(monkeypatch):
    monkeypatch.setitem(bench.WORKLOADS, "tiny", ("vit_small_patch16_224", {"depth": 1, "embed_dim": 16,
                                                                            "num_heads": 2}))
    arms = bench.build("tiny")
    sizes, canvas = [(32, 48), (48, 16)], (48, 48)
    share = bench.shares(arms["stock"], sizes, canvas)
    assert share["tokens"] == (1 + 6) + (1 + 3) and share["canvas_tokens"] == 2 * (1 + 9)
    assert share["valid_token_share"] == pytest.approx(11 / 20)
    assert share["padded_pixels"] == pytest.approx(1 - (32 * 48 + 48 * 16) / (2 * 48 * 48))
    batch = bench.vispos.nested_tensor_from_tensor_list([torch.randn(3, *s) for s in sizes])
    times = bench.time_arms(arms, batch, repeats=1, warmup=0)
    assert set(times) == {(mode, arm) for mode in bench.MODES for arm in bench.ARMS}
    assert all(t["wall"] > 0 for t in times.values())


def test_attention_rows_agree():
    rows = bench.attention_rows([5, 9, 3], heads=2, head_dim=8, repeats=1,
                                names={"SDPA, block-diagonal bool mask", "nested jagged tensors + SDPA"})
    assert [r[0] for r in rows] == ["per-item SDPA (packed mode)", "SDPA, block-diagonal bool mask",
                                    "nested jagged tensors + SDPA"]
    for name, err, fwd, both in rows:
        assert err < 1e-5, name
        assert isinstance(both, float), (name, both)
