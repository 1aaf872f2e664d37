"""vispos.invariance.cells._norms and vispos.invariance.cells._pools: statistics over valid cells against slow
references (each item cropped to its box, the valid cells gathered by hand), values and gradients,
for each item's box and for the mask fallback."""

import pytest
import torch
import torch.nn.functional as F

from vispos import Padding
from vispos.invariance.cells import _norms as norms
from vispos.invariance.cells import _pools as pools

PADDING = Padding.from_sizes([(5, 7), (6, 3), (2, 7)], (6, 7))
ARBITRARY = Padding.from_mask(PADDING.mask, classify=False)  # the same cells, read as any mask
SYMMETRIC = Padding.from_sizes([(3, 5), (6, 3)], (6, 7), starts="symmetric")


def _valid_cells(x: torch.Tensor, padding: Padding) -> torch.Tensor:
    """(C, n): every item's box cells, concatenated (the slow reference's input)."""
    return torch.cat([x[(b, slice(None), *padding.region(b))].flatten(1) for b in range(x.shape[0])], 1)


@pytest.mark.parametrize("padding", [PADDING, SYMMETRIC, ARBITRARY], ids=["origin", "symmetric", "arbitrary"])
@pytest.mark.parametrize("strips", [False, True], ids=["masked", "strips"])
def test_box_fill_writes_exactly_the_padding(padding, strips, monkeypatch):
    monkeypatch.setattr(pools, "_STRIPS_FROM", 0 if strips else 1 << 40)
    x = torch.randn(padding.batch, 4, *padding.spatial)
    got = pools.fill(x.clone(), padding, -3.0)
    torch.testing.assert_close(got, x.masked_fill(padding.mask.unsqueeze(1), -3.0), rtol=0, atol=0)
    # under autograd: one node, whose backward zeroes the gradient's padding
    leaf = x.clone().requires_grad_()
    g = torch.randn_like(x)
    pools.fill(leaf * 1.0, padding, -3.0).backward(g)
    torch.testing.assert_close(leaf.grad, g.masked_fill(padding.mask.unsqueeze(1), 0.0), rtol=0, atol=0)


@pytest.mark.parametrize("padding", [PADDING, SYMMETRIC], ids=["origin", "symmetric"])
@pytest.mark.parametrize("affine", [True, False])
def test_box_batch_norm_equals_batch_norm_of_the_valid_cells(padding, affine):
    """With NaN in the padding, which the statistics may not read."""
    torch.manual_seed(0)
    c = 4
    x = torch.randn(padding.batch, c, *padding.spatial, dtype=torch.float64) * 3 + 5
    x = x.masked_fill(padding.mask.unsqueeze(1), float("nan")).requires_grad_()
    w = (torch.rand(c, dtype=torch.float64) + 0.5).requires_grad_() if affine else None
    b = torch.randn(c, dtype=torch.float64).requires_grad_() if affine else None
    rm, rv = torch.zeros(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64)
    tracked = torch.tensor(0)
    y = norms.batch_norm(x, padding, rm, rv, w, b, True, 0.1, 1e-5, tracked)
    # reference: torch's batch norm over the valid cells alone
    ref_rm, ref_rv = torch.zeros(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64)
    cells = _valid_cells(x, padding)[None, :, :, None]  # (1, C, n, 1)
    ref = F.batch_norm(cells, ref_rm, ref_rv, w, b, True, 0.1, 1e-5)[0, :, :, 0]
    torch.testing.assert_close(_valid_cells(y, padding), ref)
    torch.testing.assert_close(rm, ref_rm)
    torch.testing.assert_close(rv, ref_rv)
    assert int(tracked) == 1
    # gradients of a loss on valid cells equal the reference's
    g = torch.randn_like(ref)
    got = torch.autograd.grad((_valid_cells(y, padding) * g).sum(), [x] + ([w, b] if affine else []))
    want = torch.autograd.grad((ref * g).sum(), [x] + ([w, b] if affine else []))
    torch.testing.assert_close(_valid_cells(got[0], padding), _valid_cells(want[0], padding))
    assert float(got[0].masked_select(padding.mask.unsqueeze(1).expand_as(x)).abs().max()) == 0.0
    for a, r in zip(got[1:], want[1:]):
        torch.testing.assert_close(a, r)


def test_box_batch_norm_gradcheck():
    """The closed-form backward against finite differences, padded outputs included in the loss; a
    second derivative is refused, not silently zero."""
    torch.manual_seed(1)
    padding = Padding.from_sizes([(2, 3), (3, 2)], (3, 3))
    x = torch.randn(2, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(2, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    fn = lambda x, w, b: norms.batch_norm(x, padding, None, None, w, b, True, 0.1, 1e-5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))
    (gx,) = torch.autograd.grad(fn(x, w, b).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()


def test_box_group_norm_and_pools_equal_each_item_alone():
    torch.manual_seed(2)
    x = torch.randn(PADDING.batch, 6, *PADDING.spatial, dtype=torch.float64)
    w, b = torch.rand(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    gn = norms.group_norm(x, PADDING, 3, w, b, 1e-5)
    masked = norms.group_norm(x, ARBITRARY, 3, w, b, 1e-5)
    for i in range(PADDING.batch):
        item = x[(slice(i, i + 1), slice(None), *PADDING.region(i))]
        region = (slice(i, i + 1), slice(None), *PADDING.region(i))
        torch.testing.assert_close(gn[region], F.group_norm(item, 3, w, b, 1e-5))
        torch.testing.assert_close(masked[region], F.group_norm(item, 3, w, b, 1e-5))
        for mode, fn in (("mean", torch.mean), ("sum", torch.sum), ("max", torch.amax),
                         ("norm", lambda t, d: torch.linalg.vector_norm(t, 2, d))):
            torch.testing.assert_close(pools.global_pool(x, PADDING, mode, (2, 3), False)[i], fn(item, (2, 3))[0])
            torch.testing.assert_close(pools.global_pool(x, ARBITRARY, mode, (2, 3), False)[i],
                                       fn(item, (2, 3))[0])


@pytest.mark.parametrize("count_include_pad, ceil_mode", [(False, True), (False, False), (True, False), (True, True)])
def test_avg_pool_divides_as_the_item_alone(count_include_pad, ceil_mode):
    torch.manual_seed(3)
    x = torch.randn(PADDING.batch, 2, *PADDING.spatial, dtype=torch.float64)
    got = pools.avg_pool(x, PADDING, (3, 3), (2, 2), (1, 1), ceil_mode, count_include_pad, None)
    for i in range(PADDING.batch):
        item = x[(slice(i, i + 1), slice(None), *PADDING.region(i))]
        alone = F.avg_pool2d(item, 3, 2, 1, ceil_mode, count_include_pad)
        torch.testing.assert_close(got[i, :, : alone.shape[2], : alone.shape[3]], alone[0])


def test_mask_fallback_batch_norm_matches_the_box_one():
    torch.manual_seed(4)
    x = torch.randn(PADDING.batch, 3, *PADDING.spatial, dtype=torch.float64)
    w, b = torch.rand(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    rm1, rv1, rm2, rv2 = torch.zeros(3), torch.ones(3), torch.zeros(3), torch.ones(3)
    a = norms.batch_norm(x, ARBITRARY, rm1, rv1, w, b, True, 0.1, 1e-5)
    c = norms.batch_norm(x, PADDING, rm2, rv2, w, b, True, 0.1, 1e-5)
    valid = ~PADDING.mask.unsqueeze(1).expand_as(x)
    torch.testing.assert_close(a[valid], c[valid])
    torch.testing.assert_close(rm1, rm2)
    torch.testing.assert_close(rv1, rv2)


@pytest.mark.parametrize("padding", [PADDING, ARBITRARY.mask.unsqueeze(1)], ids=["box", "mask"])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_zero_padding_writes_zeros_and_keeps_the_padding_out_of_the_gradients(padding, training):
    """``zero_padding``: the valid cells as without it, zeros in the padding, and the bias's
    gradient from the valid cells alone (the padding no longer holds the bias); finite differences
    agree (padded outputs in the loss)."""
    torch.manual_seed(5)
    mask = padding.mask.unsqueeze(1) if isinstance(padding, Padding) else padding
    x = torch.randn(3, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(2, dtype=torch.float64) + 0.5).requires_grad_()
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)

    def fn(x, w, b, zero_padding):
        return norms.batch_norm(x, padding, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5, None, zero_padding)

    plain, zeroed = fn(x, w, b, False), fn(x, w, b, True)
    valid = ~mask.expand_as(x)
    torch.testing.assert_close(zeroed[valid], plain[valid], rtol=0, atol=0)
    assert float(zeroed.detach()[~valid].abs().max()) == 0.0
    g = torch.randn_like(plain)
    got = torch.autograd.grad((zeroed * g).sum(), (x, w, b))
    want = torch.autograd.grad((plain * g.masked_fill(~valid, 0.0)).sum(), (x, w, b))
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r)
    assert torch.autograd.gradcheck(lambda x, w, b: fn(x, w, b, True), (x, w, b))


def test_item_boxes_from_the_host_and_from_the_mask_agree(monkeypatch):
    """Each item's box as tensors: from the host boxes, and from the mask (what a compiled graph or
    a CUDA graph capture reads), an empty item included; an arbitrary mask outside a trace is
    refused."""
    padding = Padding.from_sizes([(3, 5), (6, 3), (0, 4)], (6, 7), starts=[(2, 1), (0, 4), (0, 0)])
    starts, sizes = pools.item_boxes(padding, torch.device("cpu"))
    assert starts.tolist() == [[2, 1], [0, 4], [0, 0]] and sizes.tolist() == [[3, 5], [6, 3], [0, 0]]
    monkeypatch.setattr(pools._tracing, "host_facts", lambda device: False)
    masked = pools.item_boxes(padding, torch.device("cpu"))
    assert masked[0].tolist() == starts.tolist() and masked[1].tolist() == sizes.tolist()
    with pytest.raises(ValueError, match="arbitrary padding mask"):
        pools.item_boxes(ARBITRARY, torch.device("cpu"))


@pytest.mark.parametrize("mode", ["min", "norm:1", "norm:inf", "var:1", "std:0"])
def test_global_pool_statistics_equal_each_item_alone(mode):
    """Each item's minimum, L1 / max norm, variance and standard deviation over its own cells equal
    torch's on the item cropped to its box (float64), a NaN in the padding never reaching them."""
    x = torch.randn(3, 4, 6, 7, dtype=torch.float64).masked_fill(PADDING.mask[:, None], float("nan"))
    got = pools.global_pool(x, PADDING, mode, (2, 3), False)
    for b in range(3):
        item = x[(b, slice(None), *PADDING.region(b))][None]
        torch.testing.assert_close(got[b], pools.global_pool(item, None, mode, (2, 3), False)[0])
