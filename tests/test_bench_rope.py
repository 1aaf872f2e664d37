"""benchmarks/bench_rope.py compares like with like: on a tiny grid, every row runs and the rows
of one workload agree on the unpadded items (the padded item is where mask-awareness differs)."""

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("timm.layers.pos_embed_sincos")
bench = pytest.importorskip("benchmarks.bench_rope")

PADDED = 3  # the benchmark pads item 3 of 8


def _as_tensor(out):
    return torch.stack(list(out)) if isinstance(out, (tuple, list)) else out


def test_rows_agree_on_unpadded_items():
    with torch.inference_mode():
        workloads = bench._side_workloads(4, torch.device("cpu"))
        assert len(workloads) == 4
        dino_table, mixed_table, dino_qk, mixed_qk = workloads
        for wl in workloads:
            for name, fn in wl.impls.items():
                assert fn() is not None, (wl.name, name)
        keep = [b for b in range(bench.BATCH) if b != PADDED]

        grid = dino_table.impls["timm get_embed(grid) (mask-blind, 1 table)"]()
        assert torch.equal(dino_table.impls["vispos get_embed(grid) (mask-blind, 1 table)"](), grid)
        per_item = dino_table.impls["vispos get_embed(mask=...)"]()
        assert per_item.shape == (bench.BATCH, 16, 2 * bench.HEAD_DIM)
        assert torch.equal(per_item[keep], grid.expand(len(keep), -1, -1))
        packed = dino_table.impls["timm get_batch_embeds(shapes, seq_len) (packed)"]()
        valid = ~bench._padded_mask(4, torch.device("cpu"))[PADDED].flatten()
        assert torch.equal(per_item[PADDED][valid], packed[PADDED][: int(valid.sum())])

        m_grid = mixed_table.impls["timm get_embed(grid)"]()
        assert torch.equal(mixed_table.impls["vispos get_embed(grid)"](), m_grid)
        m_items = mixed_table.impls["vispos get_embed(mask=...)"]()
        assert torch.equal(m_items[:, keep], m_grid.unsqueeze(1).expand(-1, len(keep), -1, -1, -1))

        for wl in (dino_qk, mixed_qk):
            outs = {name: _as_tensor(fn()) for name, fn in wl.impls.items() if name != bench.FLOOR}
            ref = next(iter(outs.values()))  # timm's table + timm's rotation
            for name, out in outs.items():
                assert out.shape == ref.shape, name
                assert_close(out[:, keep], ref[:, keep], rtol=1e-6, atol=1e-6, msg=f"{wl.name}: {name}")
