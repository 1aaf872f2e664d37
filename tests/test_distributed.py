"""DistributedDataParallel on two CPU processes (gloo, loopback only) trains a tiny DETR-style
model (timm backbone + Joiner + DetrEncoder) to the same parameters as one process on the same
global batch."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vispos
from vispos.backbones import Joiner, TimmBackbone
from vispos.transformer import DetrEncoder

WORLD = 2
STEPS = 3
LR = 0.05


class TinyDetr(torch.nn.Module):
    """Backbone + Joiner (2 levels projected to 32 channels) + one encoder layer."""

    def __init__(self):
        super().__init__()
        backbone = TimmBackbone("resnet18", out_indices=(3, 4), frozen_batch_norm=True)
        pe = vispos.PositionEmbeddingSine(16, normalize=True, offset=-0.5)
        self.joiner = Joiner(backbone, pe, hidden_dim=32, num_feature_levels=2, num_groups=8)
        self.encoder = DetrEncoder(32, nhead=4, num_layers=1, dim_feedforward=32, dropout=0.0)

    def forward(self, tensors, mask):
        flat = self.joiner.flatten(*self.joiner(vispos.NestedTensor(tensors, mask)))
        memory = self.encoder(flat)
        valid = (~flat.key_padding_mask).unsqueeze(-1).to(memory.dtype)
        # a per-item mean over valid tokens, then a mean over items: the global loss is the
        # mean of the per-rank losses when every rank holds as many items
        per_item = (memory.pow(2) * valid).sum((1, 2)) / valid.sum((1, 2))
        return per_item.mean()


def _model():
    torch.manual_seed(0)
    return TinyDetr()


def _global_batch():
    """Four images of different sizes padded once into one batch (ranks take slices of it, so
    every rank sees exactly the padding the single-process run sees)."""
    g = torch.Generator().manual_seed(1)
    sizes = [(32, 32), (24, 32), (32, 20), (28, 28)]
    return vispos.nested_tensor_from_tensor_list([torch.randn(3, *s, generator=g) for s in sizes])


def _train(model, tensors, mask, steps=STEPS):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(tensors, mask)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        model = torch.nn.parallel.DistributedDataParallel(_model())
        batch = _global_batch()
        per_rank = len(batch) // WORLD
        part = slice(rank * per_rank, (rank + 1) * per_rank)
        losses = _train(model, batch.tensors[part], batch.mask[part])
        state = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
        torch.save({"state": state, "losses": torch.stack(losses)}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
@pytest.mark.skipif(sys.platform == "win32", reason="spawned workers with a tcp store")
def test_ddp_two_cpu_processes_match_single_process(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]

    single = _model()
    initial = {k: v.clone() for k, v in single.state_dict().items()}
    batch = _global_batch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses = _train(single, batch.tensors, batch.mask)
    finally:
        torch.set_num_threads(threads)
    reference = single.state_dict()

    # the replicas agree exactly (DDP broadcasts and all-reduces the same gradients)
    for key, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][key]), key
    # and equal the single-process run up to float reduction order
    max_diff = 0.0
    changed = 0
    for key, value in reference.items():
        got = ranks[0]["state"][key]
        assert got.shape == value.shape, key
        if value.is_floating_point():
            max_diff = max(max_diff, (got - value).abs().max().item())
            torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-5, msg=key)
            changed += int(not torch.equal(value, initial[key]))
    assert changed > 10  # the steps did train the backbone, projections and encoder
    # the rank-mean loss is the global loss
    torch.testing.assert_close((ranks[0]["losses"] + ranks[1]["losses"]) / 2, torch.stack(losses), rtol=1e-5, atol=1e-6)
    print(f"DDP vs single process: max abs parameter difference {max_diff:.3g}")
