"""Vision RoPE's device branch (a mask on an accelerator, or a traced call) reads nothing back
from the device: no op whose result goes to the host, no ``tolist``; and it gives the host
branch's tables bit for bit. On CPU the branch is forced by switching ``host_side`` off (the one
switch the CUDA path takes); on CUDA, ``set_sync_debug_mode("error")`` checks the real thing."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vispos
import vispos._tracing as core
from vispos import DinoV3RotaryEmbedding, MixedRotaryEmbedding
from vispos.encodings import _rope_grid

# aten ops whose result is read on the host (as tests/test_op_counts.py lists them)
_HOST_READS = {
    "_local_scalar_dense", "equal", "nonzero", "_unique2", "unique_dim", "unique_consecutive",
    "masked_select", "is_nonzero", "allclose",
}


class _ForbidHostReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in _HOST_READS:
            raise AssertionError(f"the device branch read a tensor on the host: aten.{func.overloadpacket.__name__}")
        return func(*args, **(kwargs or {}))


def _masks():
    boxes = torch.ones(3, 6, 7, dtype=torch.bool)  # True = padding
    boxes[0] = False
    boxes[1, :4, :5] = False
    boxes[2, 1:5, 2:6] = False  # centred (MONAI's symmetric padding)
    holes = boxes.clone()
    holes[0, 2, 3] = True  # not a box: the bounding box, identity in the hole
    volume = torch.ones(2, 4, 5, 6, dtype=torch.bool)
    volume[0] = False
    volume[1, 1:3, :4, 1:6] = False
    return {"2D boxes": boxes, "2D holes": holes, "3D boxes": volume}


def _modules(num_axes):
    torch.manual_seed(0)
    return {
        "dinov3": DinoV3RotaryEmbedding(12 * num_axes, num_axes=num_axes, normalize_coords="max"),
        "mixed": MixedRotaryEmbedding(24 * num_axes, 2, 2, num_axes=num_axes),
    }


@pytest.mark.parametrize("kind", ["dinov3", "mixed"])
@pytest.mark.parametrize("name", list(_masks()))
def test_device_branch_reads_nothing_and_equals_the_host_branch(monkeypatch, kind, name):
    mask = _masks()[name]
    rope = _modules(mask.dim() - 1)[kind]
    with torch.no_grad():
        expected = rope.get_embed(mask=mask)
        monkeypatch.setattr(core, "host_side", lambda device: False)
        monkeypatch.setattr(_rope_grid, "host_side", lambda device: False)

        def no_tolist(self):
            raise AssertionError("the device branch called Tensor.tolist")

        monkeypatch.setattr(torch.Tensor, "tolist", no_tolist)
        with _ForbidHostReads():
            got = rope.get_embed(mask=mask)
            padding = vispos.Padding.from_mask(mask)
            assert padding.kind == "arbitrary"
            from_padding = rope.get_embed(mask=padding)
        monkeypatch.undo()
    assert torch.equal(got, expected)
    assert torch.equal(from_padding, expected)


def test_forbid_host_reads_catches_the_host_branch():
    mask = _masks()["2D holes"]
    with pytest.raises(AssertionError, match="aten"), _ForbidHostReads():
        DinoV3RotaryEmbedding(24).get_embed(mask=mask)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["dinov3", "mixed"])
@pytest.mark.parametrize("name", list(_masks()))
def test_no_host_sync_on_cuda(kind, name):
    mask = _masks()[name]
    rope = _modules(mask.dim() - 1)[kind]
    expected = rope.get_embed(mask=mask).detach()
    rope = rope.cuda()
    cuda_mask = mask.cuda()
    with torch.no_grad():
        rope.get_embed(mask=cuda_mask)  # first call: lazy CUDA initialisation may synchronise
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = rope.get_embed(mask=cuda_mask)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=2e-6)
