"""benchmarks/bench_fourier.py compares like with like: on its quick sizes every row runs and the
rows of one workload return the same numbers where they promise to."""

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("segment_anything")
bench = pytest.importorskip("benchmarks.bench_fourier")


def test_rows_agree():
    with torch.inference_mode():
        dense, padded, volume, *tables = bench.build_workloads(torch.device("cpu"), quick=True)
        for wl in (dense, padded, volume, *tables):
            for name, fn in wl.impls.items():
                assert fn() is not None, (wl.name, name)

        rows = {name: fn() for name, fn in dense.impls.items() if name != bench.FLOOR}
        sam = rows.pop("segment_anything PositionEmbeddingRandom")
        assert_close(rows["vispos PositionEmbeddingRandom"], sam, rtol=0, atol=0)
        assert_close(rows["transformers SamModel grid"][0], sam, rtol=0, atol=0)

        canvas = padded.impls["segment_anything canvas, repeated (as SamModel)"]()
        assert_close(padded.impls["vispos frame='canvas'"](), canvas, rtol=0, atol=0)
        pasted, item = padded.impls["segment_anything per item, pasted"](), padded.impls["vispos frame='item'"]()
        for b, (h, w) in enumerate(bench.sam_items(16)):
            assert_close(item[b, :, :h, :w], pasted[b, :, :h, :w], rtol=0, atol=0)

        torch.manual_seed(0)
        monai = volume.impls["MONAI build_fourier_position_embedding"]()
        torch.manual_seed(0)
        assert_close(volume.impls["vispos monai_fourier"](), monai.data, rtol=0, atol=0)

        for wl in tables:
            peer, ours = (fn() for name, fn in wl.impls.items() if name != bench.FLOOR)
            assert_close(ours, peer, rtol=0, atol=0)
