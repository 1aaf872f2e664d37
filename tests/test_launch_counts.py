"""Kernels one step launches on a GPU, counted on the CPU (``benchmarks/count_launches.py``: a
``TorchDispatchMode`` with vispos' CUDA code paths chosen; views, metadata and allocation-only ops
excluded; each vispos custom op weighed by the Triton kernels it declares): padding invariance
costs at most 1.5x the stock model's launches, and the count does not grow with the batch (no work
per item). Small items keep it quick: the counts do not depend on the items' sizes.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.count_launches import MODELS, count

BATCHES = (2, 8, 32)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("step", MODELS["resnet50"][2])
def test_resnet50_invariant_launches_stay_within_one_and_a_half_stock_and_do_not_grow_with_the_batch(step):
    counts = {b: count("resnet50", step, b, sides=(32, 64)) for b in BATCHES}
    for b, (stock, invariant) in counts.items():
        assert invariant <= 1.5 * stock, (step, b, stock, invariant)
    assert len({invariant for _, invariant in counts.values()}) == 1, counts


@pytest.mark.slow
@pytest.mark.parametrize("name, step", [("convnext_tiny", "train"), ("vit_small", "train"), ("r3d_18", "train")])
def test_other_backbones_invariant_launches_stay_within_one_and_a_half_stock(name, step):
    stock, invariant = count(name, step, 8, sides=(32, 64) if MODELS[name][1] == 2 else (16, 24))
    assert invariant <= 1.5 * stock, (name, step, stock, invariant)
