"""The fused ops' boundaries (vispos.ops): strided and expanded parameters and running statistics,
masks and paddings of the wrong shape, scalars in the statistics' dtype, statistics as precise as
the torch path far from zero, the sine ops' ``out``, boxes and counts, ``num_groups=0``, and every
launch under its tensor's device guard. The Triton path runs under Triton's interpreter on the CPU."""

import contextlib

import pytest
import torch

pytest.importorskip("triton")

from vispos import Padding  # noqa: E402
from vispos.invariance.cells import _norms as norms  # noqa: E402
from vispos.ops import _sizes, _triton  # noqa: E402
from vispos.ops.batch_norm import batch_norm  # noqa: E402
from vispos.ops.group_norm import group_norm  # noqa: E402
from vispos.ops.sine import sine_boxes, sine_counts  # noqa: E402

PATHS = ["torch", "triton"]


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch):
    """Small tiles and several chunks per reduction on tiny maps (the interpreter runs every program)."""
    monkeypatch.setattr(_sizes, "BLOCK_CELLS", 16)
    monkeypatch.setattr(_sizes, "BLOCK_CHANNELS_LAST", 2)
    monkeypatch.setattr(_sizes, "MIN_CHUNK_BLOCKS", 1)
    monkeypatch.setattr(_sizes, "MAX_SPLIT", 4)


def _path(path):
    return _triton.interpreted() if path == "triton" else contextlib.nullcontext()


def _batch(c=3, dtype=torch.float32, seed=0, scale=1.0, loc=0.0):
    g = torch.Generator().manual_seed(seed)
    padding = Padding.from_sizes([(5, 6), (3, 4), (2, 6)], (5, 6))
    x = (torch.randn(3, c, 5, 6, generator=g, dtype=torch.float64) * scale + loc).to(dtype)
    return x, padding.mask.unsqueeze(1), padding


def test_strided_and_expanded_weight_bias_and_running_statistics():
    """A strided weight, an expanded (stride 0) bias and strided running statistics give the Triton
    path the torch path's output and running statistics, and the running statistics' neighbours in
    their storage stay untouched (the kernels read and wrote them as if contiguous)."""
    x, mask, _ = _batch(c=4)
    g = torch.Generator().manual_seed(1)
    wide = torch.rand(8, generator=g) + 0.5
    results = {}
    for path in PATHS:
        weight, bias = wide[::2], torch.tensor(0.25).expand(4)
        store = torch.arange(16, dtype=torch.float32)
        rm, rv = store[::4], store[1::4]
        with _path(path):
            y = batch_norm(x, weight, bias, mask, 0, 1e-5, False, 0.1, rm, rv, None)
        results[path] = (y, rm.clone(), rv.clone(), store.clone())
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want)
    store = results["triton"][3]
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[::4] = untouched[1::4] = False
    torch.testing.assert_close(store[untouched], torch.arange(16, dtype=torch.float32)[untouched], rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_running_statistics_that_share_memory_are_refused(path):
    x, mask, _ = _batch()
    with _path(path), pytest.raises(ValueError, match="running_mean is written in place.*stride 0"):
        batch_norm(x, None, None, mask, 0, 1e-5, False, 0.1, torch.zeros(1).expand(3), torch.ones(3), None)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["batch", "group"])
def test_a_mask_of_another_shape_is_refused(path, op):
    """A transposed ``(B, 1, W, H)`` mask and a ``(1, 1, H, W)`` mask for a batch of 3 raise on both
    paths (the Triton path read them as ``(B, 1, H, W)``, or read past the end)."""
    x, mask, _ = _batch(c=4)
    call = ((lambda m: batch_norm(x, None, None, m, 0, 1e-5, False, 0.1, None, None, None)) if op == "batch"
            else (lambda m: group_norm(x, None, None, m, 2, 1e-5)))
    for bad in (mask.transpose(2, 3).contiguous(), mask[:1]):
        with _path(path), pytest.raises(ValueError, match=r"mask must have shape \(B, 1, \*S\) = \(3, 1, 5, 6\)"):
            call(bad)


@pytest.mark.parametrize("path", PATHS)
def test_a_padding_of_another_shape_is_refused(path):
    """A Padding whose spatial sizes are transposed against ``x`` raises, naming both."""
    x = torch.randn(2, 3, 5, 6)
    padding = Padding.from_sizes([(6, 5), (3, 2)], (6, 5))
    with _path(path):
        with pytest.raises(ValueError, match=r"batch norm: the padding describes .* \(6, 5\), but x has shape"):
            norms.batch_norm(x, padding, None, None, None, None, True, 0.1, 1e-5)
        with pytest.raises(ValueError, match=r"group norm: the padding describes .* \(6, 5\), but x has shape"):
            norms.group_norm(x, padding, 3, None, None, 1e-5)


@pytest.mark.parametrize("groups, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError)])
def test_num_groups_is_checked(groups, error):
    """``num_groups=0`` raised ZeroDivisionError; now a ValueError naming it, as for the op."""
    x, mask, padding = _batch(c=4)
    with pytest.raises(error, match="num_groups"):
        norms.group_norm(x, padding, groups, None, None, 1e-5)
    with pytest.raises(error, match="num_groups"):
        group_norm(x, None, None, mask, groups, 1e-5)


def test_eps_and_momentum_in_the_statistics_dtype():
    """float64 maps and running statistics: the Triton path's running statistics and output match
    the torch path's to float64 round-off (``eps`` and ``momentum`` reached the kernel as float32:
    off by about 5e-8)."""
    x, mask, _ = _batch(c=3, dtype=torch.float64, scale=0.01)
    out = {}
    for path in PATHS:
        rm, rv = torch.full((3,), 0.3, dtype=torch.float64), torch.full((3,), 0.7, dtype=torch.float64)
        with _path(path):
            y = batch_norm(x, None, None, mask, 0, 1.1e-5, False, 0.1, rm, rv, torch.tensor(2))
            y_gn = group_norm(x, None, None, mask, 3, 1.1e-5)
        out[path] = (y, rm, rv, y_gn)
    for got, want in zip(out["triton"], out["torch"]):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def _error(got: torch.Tensor, truth: torch.Tensor) -> float:
    """The largest error relative to the largest value of ``truth``."""
    return ((got.double() - truth).abs().max() / truth.abs().max()).item()


@pytest.mark.parametrize("loc, scale", [(1e3, 1.0), (1e4, 1e-2)])
def test_statistics_far_from_zero_as_precise_as_the_torch_path(loc, scale):
    """float32 maps of mean ``loc`` and deviation ``scale`` (mean / std up to 1e6): the Triton path's
    batch-norm variance (from its running variance) and group-norm output stay within 2x of the torch
    path's error against float64, or a few float32 rounding steps where the torch path happens to do
    better (the per-lane Welford in float32 was 4.6-12x off on the variance, and 84x on group norm's
    input gradient)."""
    x, mask, _ = _batch(c=2, dtype=torch.float32, seed=3, scale=scale, loc=loc)
    exact = x.double()
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    truth, errors = None, {}
    for path in ["float64", *PATHS]:
        data = exact if path == "float64" else x
        xx = data.clone().requires_grad_()
        rv = torch.zeros(2, dtype=data.dtype)
        with _path("triton" if path == "triton" else "torch"):
            batch_norm(xx.detach(), None, None, mask, 0, 1e-12, False, 1.0, torch.zeros(2, dtype=data.dtype), rv,
                       None)
            y = group_norm(xx, None, None, mask, 1, 1e-12)
            y.backward(dy.to(data.dtype))
        if path == "float64":
            truth = (rv, y.detach(), xx.grad)
            continue
        errors[path] = [_error(a, b) for a, b in zip((rv, y.detach(), xx.grad), truth)]
    for name, triton_error, torch_error in zip(["bn variance", "gn output", "gn grad_x"], errors["triton"],
                                               errors["torch"]):
        assert triton_error <= max(2 * torch_error, 4 * 2.0**-23), (name, triton_error, torch_error)


def _sine_args(out_shape=(2, 8, 3, 4)):
    divisors = torch.tensor([1.0, 10.0])
    return divisors, None, True, 6.283185307179586, 0.0, 1e-6, None


@pytest.mark.parametrize("path", PATHS)
def test_sine_ops_validate_out_boxes_and_counts(path):
    """``out`` channels last, too small, or not floating; boxes or counts non-contiguous, of another
    shape or dtype: refused with the parameter named (the kernel wrote wrong values or past the end
    of ``out``)."""
    args = _sine_args()
    boxes = torch.tensor([[0, 0, 3, 4], [0, 0, 2, 3]], dtype=torch.int32)
    mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    mask[1, 2:] = True
    counts = [torch.cumsum(mask, i + 1, dtype=torch.int32) for i in range(2)]
    good = torch.empty(2, 8, 3, 4)
    cases = [
        (lambda: sine_boxes(good.to(memory_format=torch.channels_last), boxes, *args), ValueError,
         "out must be contiguous"),
        (lambda: sine_boxes(torch.empty(2, 4, 3, 4), boxes, *args), ValueError, "out has 4 channels"),
        (lambda: sine_boxes(torch.empty(2, 8, 3, 4, dtype=torch.int32), boxes, *args), TypeError,
         "out must be a floating tensor"),
        (lambda: sine_boxes(good, boxes.t().contiguous().t(), *args), ValueError, "boxes must be contiguous"),
        (lambda: sine_boxes(good, boxes[:1], *args), ValueError, r"boxes must have shape \(2, 4\)"),
        (lambda: sine_boxes(good, boxes.long(), *args), TypeError, "boxes must be int32"),
        (lambda: sine_counts(good, [counts[0].transpose(1, 2).contiguous().transpose(1, 2), counts[1]], *args),
         ValueError, r"counts\[0\] must be contiguous"),
        (lambda: sine_counts(good, counts[:1], *args), ValueError, "one tensor per spatial axis"),
        (lambda: sine_counts(good, [counts[0][:, :2], counts[1]], *args), ValueError,
         r"counts\[0\] must have shape \(2, 3, 4\)"),
    ]
    with _path(path):
        for call, error, match in cases:
            with pytest.raises(error, match=match):
                call()
        sine_boxes(good, boxes, *args)  # the good call still runs
        sine_counts(good, counts, *args)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_every_launch_runs_under_its_tensors_device_guard():
    """A batch norm, a group norm and a sine embedding on ``cuda:1`` while ``cuda:0`` is current give
    the CPU's numbers (Triton launches on the current device)."""
    x, mask, _ = _batch(c=4)
    want = (batch_norm(x, None, None, mask, 0, 1e-5, False, 0.1, None, None, None),
            group_norm(x, None, None, mask, 2, 1e-5))
    with torch.cuda.device(0):
        got = (batch_norm(x.cuda(1), None, None, mask.cuda(1), 0, 1e-5, False, 0.1, None, None, None),
               group_norm(x.cuda(1), None, None, mask.cuda(1), 2, 1e-5))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)


def test_group_norm_takes_a_mask_whose_axes_are_not_contiguous():
    """A transposed mask (the torch path reads it through a reshape, not a view): the same output
    as its contiguous copy, through the public wrapper."""
    from torch import nn

    import vispos

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU()).double().eval()
    inv = vispos.make_padding_invariant(net)
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    mask = torch.zeros(2, 5, 6, dtype=torch.bool)
    mask[0, 4:] = True
    mask[1, :, 3:] = True
    transposed = mask.transpose(1, 2)
    assert not transposed.is_contiguous()
    torch.testing.assert_close(inv(x, transposed).tensors, inv(x, transposed.contiguous()).tensors, rtol=0, atol=0)
