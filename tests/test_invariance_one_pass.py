"""Every item's statistics in one batched computation (vispos.invariance.cells._norms / _pools): equal in
float64 to the per-item references (each item's box cropped, torch's own layer on it), in eval and
training (outputs, running statistics, parameter and input gradients), for 1 to 3 spatial axes, an
item without a valid cell, symmetric boxes and an arbitrary mask; the number of dispatched ops
does not grow with the batch (no loop over items) and no op reads a tensor back to the host."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from vispos import Padding
from vispos.invariance.cells import _norms as norms
from vispos.invariance.cells import _pools as pools

_HOST_READS = {"_local_scalar_dense", "equal", "nonzero", "masked_select", "is_nonzero", "allclose", "item"}


class _Ops(TorchDispatchMode):
    """Counts dispatched aten ops; fails on an op that reads a tensor back to the host."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        assert name not in _HOST_READS, f"aten.{name} reads a tensor back to the host"
        self.count += 1
        return func(*args, **(kwargs or {}))


def _paddings():
    """(id, padding): 1D, 2D and 3D boxes at the origin with an empty item, symmetric boxes, and the
    2D boxes read as an arbitrary mask."""
    two = Padding.from_sizes([(5, 7), (0, 0), (6, 3), (1, 1)], (6, 7))
    return [
        ("1d", Padding.from_sizes([(9,), (4,), (0,), (7,)], (9,))),
        ("2d", two),
        ("3d", Padding.from_sizes([(3, 4, 5), (2, 1, 5), (3, 4, 2)], (3, 4, 5))),
        ("symmetric", Padding.from_sizes([(3, 5), (6, 3), (5, 6)], (6, 7), starts="symmetric")),
        ("arbitrary", Padding.from_mask(two.mask, classify=False)),
    ]


PADDINGS = _paddings()
IDS = [name for name, _ in PADDINGS]


def _region(padding, b):
    return (slice(b, b + 1), slice(None), *padding.region(b))


def _items(padding):
    """The items with at least one valid cell."""
    return [b for b in range(padding.batch) if all(s > 0 for s in padding.sizes[b])]


def _input(padding, c, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(padding.batch, c, *padding.spatial, generator=g, dtype=torch.float64) * 3 + 5
    return x.masked_fill(padding.mask.unsqueeze(1), float("nan"))  # the padding is never read


def _cells(t, padding):
    """``Tensor[C, n]``: every item's box cells, concatenated."""
    return torch.cat([t[_region(padding, b)].flatten(2) for b in _items(padding)], 2).transpose(0, 1).flatten(1)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("name, padding", PADDINGS, ids=IDS)
def test_batch_norm_in_training_equals_batch_norm_of_the_valid_cells(name, padding, momentum):
    c = 3
    x = _input(padding, c, 0).requires_grad_()
    w = (torch.rand(c, dtype=torch.float64) + 0.5).requires_grad_()
    bias = torch.randn(c, dtype=torch.float64).requires_grad_()
    rm0, rv0 = torch.rand(c, dtype=torch.float64), torch.rand(c, dtype=torch.float64) + 0.5
    rm, rv, tracked = rm0.clone(), rv0.clone(), torch.tensor(3)
    y = norms.batch_norm(x, padding, rm, rv, w, bias, True, momentum, 1e-5, tracked)
    assert torch.isfinite(y).all()  # the NaN in the padding is never read
    # reference: torch's batch norm on every item's valid cells gathered by hand
    x0 = x.detach().clone().requires_grad_()
    cells = _cells(x0, padding)
    ref = F.batch_norm(cells[None, :, :, None], None, None, w, bias, True, 0.0, 1e-5)[0, :, :, 0]
    got = _cells(y, padding)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    factor = 0.1 if momentum is not None else 1 / 4  # torch's cumulative average: 1 / num_batches_tracked
    torch.testing.assert_close(rm, rm0 * (1 - factor) + cells.detach().mean(1) * factor, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rv, rv0 * (1 - factor) + cells.detach().var(1) * factor, rtol=1e-12, atol=1e-12)
    assert int(tracked) == 4
    g = torch.randn_like(got)
    grads = torch.autograd.grad((got * g).sum(), [x, w, bias])
    want = torch.autograd.grad((ref * g).sum(), [x0, w, bias])
    for a, r in zip(grads, want):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    assert float(grads[0].masked_select(padding.mask.unsqueeze(1).expand_as(x)).abs().max()) == 0.0


@pytest.mark.parametrize("name, padding", PADDINGS, ids=IDS)
def test_batch_norm_in_eval_is_the_stock_affine_map(name, padding):
    c = 3
    x = _input(padding, c, 1)
    rm, rv = torch.rand(c, dtype=torch.float64), torch.rand(c, dtype=torch.float64) + 0.5
    w, b = torch.rand(c, dtype=torch.float64), torch.randn(c, dtype=torch.float64)
    y = norms.batch_norm(x, padding, rm, rv, w, b, False, 0.1, 1e-5)
    torch.testing.assert_close(y, F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5), equal_nan=True)


@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("name, padding", PADDINGS, ids=IDS)
def test_group_and_instance_norm_equal_each_item_alone(name, padding, groups):
    c = 6
    x = _input(padding, c, 2).requires_grad_()
    w = (torch.rand(c, dtype=torch.float64) + 0.5).requires_grad_()
    bias = torch.randn(c, dtype=torch.float64).requires_grad_()
    lone = [b for b in _items(padding) if x[_region(padding, b)][0, 0].numel() == 1]
    if groups == c and lone and padding.kind == "rectangular":  # torch refuses that item alone
        with pytest.raises(ValueError, match="group norm: item 3 has 1 valid cell"):
            norms.group_norm(x, padding, groups, w, bias, 1e-5)
        return
    y = norms.group_norm(x, padding, groups, w, bias, 1e-5)
    assert torch.isfinite(y).all()
    assert float(y.detach().masked_select(padding.mask.unsqueeze(1).expand_as(y)).abs().max()) == 0.0
    g = torch.randn_like(y)
    for b in lone if groups == c else ():  # no reference for that item
        g[_region(padding, b)] = 0
    got = torch.autograd.grad((y * g).sum(), [x, w, bias])
    x0 = x.detach().clone().requires_grad_()
    loss = 0
    for b in _items(padding):
        if b in lone and groups == c:  # arbitrary mask: no box known on the host, not refused
            continue
        alone = F.group_norm(x0[_region(padding, b)], groups, w, bias, 1e-5)
        torch.testing.assert_close(y[_region(padding, b)], alone, rtol=1e-12, atol=1e-12)
        loss = loss + (alone * g[_region(padding, b)]).sum()
    want = torch.autograd.grad(loss, [x0, w, bias])
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["mean", "sum", "max", "norm"])
@pytest.mark.parametrize("name, padding", PADDINGS, ids=IDS)
def test_global_pools_and_counts_equal_each_item_alone(name, padding, mode):
    c = 4
    x = _input(padding, c, 3).requires_grad_()
    dims = tuple(range(2, x.dim()))
    out = pools.global_pool(x, padding, mode, dims, False)
    reduce = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax,
              "norm": lambda t, d: torch.linalg.vector_norm(t, 2, d)}[mode]
    counts = pools.cell_count(x, padding, dims, False)
    for b in range(padding.batch):
        if b in _items(padding):
            torch.testing.assert_close(out[b], reduce(x[_region(padding, b)], dims)[0], rtol=1e-12, atol=1e-12)
            assert float(counts[b, 0]) == x[_region(padding, b)][0, 0].numel()
        else:
            assert float(out[b].detach().abs().max()) == 0.0 and float(counts[b, 0]) == 0.0
    g = torch.randn_like(out)
    (got,) = torch.autograd.grad((out * g).sum(), x)
    x0 = x.detach().clone().requires_grad_()
    loss = sum((reduce(x0[_region(padding, b)], dims)[0] * g[b]).sum() for b in _items(padding))
    (want,) = torch.autograd.grad(loss, x0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("strips", [False, True], ids=["masked", "strips"])
@pytest.mark.parametrize("name, padding", PADDINGS, ids=IDS)
def test_fill_under_autograd_is_one_node_with_a_masked_gradient(name, padding, strips, monkeypatch):
    monkeypatch.setattr(pools, "_STRIPS_FROM", 0 if strips else 1 << 40)
    x = torch.randn(padding.batch, 3, *padding.spatial, dtype=torch.float64, requires_grad=True)
    y = pools.fill(x * 2, padding, -7.0)
    assert type(y.grad_fn).__name__ == "_FillPaddingBackward"  # one node, one masked write
    mask = padding.mask.unsqueeze(1)
    torch.testing.assert_close(y, (x * 2).masked_fill(mask, -7.0), rtol=0, atol=0)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(got, (2 * g).masked_fill(mask, 0.0), rtol=0, atol=0)
    z = pools.filled(x, padding, 0.0)
    torch.testing.assert_close(z, x.masked_fill(mask, 0.0), rtol=0, atol=0)
    (got,) = torch.autograd.grad(z, x, g)
    torch.testing.assert_close(got, g.masked_fill(mask, 0.0), rtol=0, atol=0)


def _op_count(fn, batch):
    padding = Padding.from_sizes([(3 + b % 4, 5 - b % 3) for b in range(batch)], (6, 7))
    x = torch.randn(batch, 4, 6, 7, dtype=torch.float64, requires_grad=True)
    w = torch.rand(4, dtype=torch.float64, requires_grad=True)
    padding.mask  # noqa: B018 - built once per batch by the runner, not per layer
    with _Ops() as ops:
        fn(x, padding, w).sum().backward()
    return ops.count


@pytest.mark.parametrize("layer", ["batch_norm", "group_norm", "global_pool", "cell_count"])
def test_statistics_dispatch_as_many_ops_for_any_batch_and_read_nothing_back(layer):
    """No loop over items: the op count of forward + backward is the same for 2 and 9 items; and no
    op reads a tensor back to the host (a synchronisation on an accelerator)."""
    fns = {
        "batch_norm": lambda x, p, w: norms.batch_norm(
            x, p, torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), w, w, True, 0.1, 1e-5),
        "group_norm": lambda x, p, w: norms.group_norm(x, p, 2, w, w, 1e-5),
        "global_pool": lambda x, p, w: pools.global_pool(x * w.view(1, -1, 1, 1), p, "max", (2, 3), False),
        "cell_count": lambda x, p, w: x.sum((2, 3)) / pools.cell_count(x, p, (2, 3), False),
    }
    assert _op_count(fns[layer], 2) == _op_count(fns[layer], 9)


@pytest.mark.parametrize("zero_padding", [False, True], ids=["bias-in-padding", "zero-padding"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_batch_norm_select_reads_no_padding_in_any_dtype_or_layout(dtype, layout, zero_padding):
    """The statistics' select (a bitwise and of the bits in float32 / float64, a where otherwise):
    NaN, +inf and -inf (a max pool's fill) in the padding change nothing, in the outputs' valid
    cells and in every gradient, for each dtype and memory format; the input is not modified."""
    padding = Padding.from_sizes([(6, 7), (4, 3), (5, 6)], (6, 7))
    mask = padding.mask.unsqueeze(1)
    g = torch.Generator().manual_seed(5)
    clean = (torch.randn(3, 4, 6, 7, generator=g) * 2 + 1).masked_fill(mask, 0.0).to(dtype)
    junk = torch.tensor([float("nan"), float("inf"), -float("inf")])[torch.randint(0, 3, clean.shape, generator=g)]
    dirty = torch.where(mask, junk.to(dtype), clean)
    w = (torch.rand(4, generator=g) + 0.5).to(dtype)
    b = torch.randn(4, generator=g).to(dtype)
    gy = torch.randn(clean.shape, generator=g).to(dtype)
    outs = []
    for x in (clean, dirty):
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        x = x.clone(memory_format=fmt)
        before = x.clone()
        x.requires_grad_()
        ww, bb = w.clone().requires_grad_(), b.clone().requires_grad_()
        rm, rv = torch.zeros(4, dtype=dtype), torch.ones(4, dtype=dtype)
        y = norms.batch_norm(x, padding, rm, rv, ww, bb, True, 0.1, 1e-5, zero_padding=zero_padding)
        grads = torch.autograd.grad((y.masked_fill(mask, 0.0) * gy).sum(), [x, ww, bb])
        torch.testing.assert_close(x.detach(), before, rtol=0, atol=0, equal_nan=True)
        outs.append((y.detach().masked_fill(mask, 0.0), rm, rv, *grads))
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    if zero_padding:
        y_padding = norms.batch_norm(clean, padding, None, None, w, b, True, 0.1, 1e-5, zero_padding=True)
        assert float(y_padding.masked_select(mask.expand_as(y_padding)).abs().max()) == 0.0
