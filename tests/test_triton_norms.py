"""vispos.ops.batch_norm / group_norm and their Triton kernels: the kernels (run by Triton's interpreter on the
CPU) against the torch code they replace on CUDA, whole tensors: outputs (padding included),
statistics, running statistics, gradients of the input and the affine map; 1 to 3 spatial axes,
float32 / bfloat16 / float64, channels first and channels last, with and without padding, NaN and
+-inf in the padding, boxes and an arbitrary mask. Also: each op launches the kernels it declares
and nothing else on the device, its fake implementation matches it (``torch.library.opcheck``),
the ops compose with ``torch.compile(fullgraph=True)`` and ``torch.export``, a second derivative
is refused, and vispos works without Triton.

Every test name holds ``triton`` (``pytest -k triton``); the file is skipped without Triton."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from vispos import Padding  # noqa: E402
from vispos.ops import _triton  # noqa: E402
from vispos.ops import _sizes as geometry  # noqa: E402
from vispos.ops import batch_norm as bn_op  # noqa: E402
from vispos.ops import group_norm as gn_op  # noqa: E402
from vispos.invariance.cells import _norms as norms  # noqa: E402

BN, BN_BACKWARD = torch.ops.vispos.valid_batch_norm.default, torch.ops.vispos.valid_batch_norm_backward.default
GN, GN_BACKWARD = torch.ops.vispos.valid_group_norm.default, torch.ops.vispos.valid_group_norm_backward.default


@pytest.fixture(autouse=True)
def _small_tiles(monkeypatch):
    """Tiles of 16 cells (8 in channels last, 2 channels wide) and up to 4 chunks per reduction, so
    tiny maps run several chunks, blocks and channel blocks, with partial ones at the ends."""
    monkeypatch.setattr(geometry, "BLOCK_CELLS", 16)
    monkeypatch.setattr(geometry, "BLOCK_CHANNELS_LAST", 2)
    monkeypatch.setattr(geometry, "MIN_CHUNK_BLOCKS", 1)
    monkeypatch.setattr(geometry, "MAX_SPLIT", 4)


#: (name, canvas, item sizes or None for an arbitrary mask)
PADDINGS = {
    "1d": ((11,), [(11,), (6,), (3,)]),
    "2d": ((5, 6), [(5, 6), (3, 4), (2, 6)]),
    "2d-empty-item": ((4, 5), [(4, 5), (0, 0), (3, 2)]),
    "2d-unpadded": ((4, 5), [(4, 5), (4, 5)]),
    "3d": ((3, 4, 5), [(3, 4, 5), (2, 3, 2)]),
    "2d-arbitrary": ((5, 6), None),
}


def _padding(name: str) -> Padding:
    canvas, sizes = PADDINGS[name]
    if sizes is None:
        g = torch.Generator().manual_seed(7)
        mask = torch.rand(3, *canvas, generator=g) < 0.4
        return Padding.from_mask(mask, classify=False)
    return Padding.from_sizes(sizes, canvas)


def _inputs(padding: Padding, channels: int, dtype: torch.dtype, layout: str, seed: int = 0):
    """``x`` with NaN / +-inf in its padding, the affine map, and an output gradient that holds
    values in the padding too (the bias's gradient reads them without zero_padding)."""
    g = torch.Generator().manual_seed(seed)
    mask = padding.mask.unsqueeze(1)
    shape = (padding.batch, channels, *padding.spatial)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1
    junk = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    x = torch.where(mask, junk[torch.randint(0, 3, shape, generator=g)], x).to(dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    w = (torch.rand(channels, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    b = torch.randn(channels, generator=g, dtype=torch.float64).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, w, b, dy


def _run_both(fn):
    """``fn()`` on the Triton path (interpreted) and on the torch path: two tuples of tensors."""
    with _triton.interpreted():
        got = fn()
    return got, fn()


def _assert_all_close(got, want, names):
    for name, a, b in zip(names, got, want):
        if a is None or b is None:
            assert a is None and b is None, name
            continue
        torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")


# (padding, channels, dtype, layout, zero_padding, affine, momentum)
BN_CASES = [
    ("2d", 3, torch.float32, "contiguous", False, True, 0.1),
    ("2d", 3, torch.float32, "channels_last", True, True, None),
    ("2d", 3, torch.bfloat16, "contiguous", True, True, 0.1),
    ("2d", 3, torch.bfloat16, "channels_last", False, False, 0.1),
    ("2d", 3, torch.float64, "contiguous", False, True, None),
    ("1d", 3, torch.float32, "contiguous", True, False, 0.1),
    ("3d", 3, torch.float32, "channels_last", False, True, 0.1),
    ("3d", 2, torch.float64, "contiguous", True, True, None),
    ("2d-empty-item", 2, torch.float32, "contiguous", False, True, 0.1),
    ("2d-unpadded", 2, torch.float32, "channels_last", False, True, 0.1),
    ("2d-arbitrary", 3, torch.float32, "contiguous", True, True, None),
]


def _bn_id(case) -> str:
    name, _, dtype, layout, zero_padding, affine, momentum = case
    return f"{name}-{str(dtype)[6:]}-{layout}-zp{int(zero_padding)}-aff{int(affine)}-m{momentum}"


@pytest.mark.parametrize("case", BN_CASES, ids=_bn_id)
def test_triton_batch_norm_equals_the_torch_code(case):
    """Through the public call (a Padding's boxes give the count on the host, an arbitrary mask's
    is counted on the device): the output (padding included), the running statistics and
    ``num_batches_tracked``, the gradients of x, weight and bias; the op's mean and inverse
    deviation; the input unchanged."""
    name, c, dtype, layout, zero_padding, affine, momentum = case
    padding = _padding(name)
    if name == "2d-arbitrary":
        padding = padding.mask.unsqueeze(1)  # a bare mask: the count on the device
    mask = padding if isinstance(padding, torch.Tensor) else padding.mask.unsqueeze(1)
    x, w, b, dy = _inputs(padding if isinstance(padding, Padding) else _padding(name), c, dtype, layout)
    stat = torch.float64 if dtype == torch.float64 else torch.float32

    def call():
        xx = x.clone().requires_grad_()
        ww, bb = (w.clone().requires_grad_(), b.clone().requires_grad_()) if affine else (None, None)
        rm, rv = torch.zeros(c, dtype=stat), torch.ones(c, dtype=stat)
        tracked = torch.tensor(4)
        y = norms.batch_norm(xx, padding, rm, rv, ww, bb, True, momentum, 1e-5, tracked, zero_padding)
        y.backward(dy)
        _, mean, invstd, _ = BN(x, w if affine else None, b if affine else None, mask, 0, 1e-5, zero_padding,
                                momentum, None, None, None)
        return (y.detach(), rm, rv, tracked, xx.grad, ww.grad if affine else None, bb.grad if affine else None,
                mean, invstd, xx.detach())

    got, want = _run_both(call)
    _assert_all_close(got, want, ["y", "running_mean", "running_var", "num_batches_tracked", "grad_x", "grad_weight",
                                  "grad_bias", "mean", "invstd", "x"])
    torch.testing.assert_close(got[-1], x, rtol=0, atol=0, equal_nan=True)  # the input is not modified
    assert got[0].stride() == x.stride() and got[4].stride() == x.stride()  # the input's layout kept
    assert not got[4].masked_select(mask.expand_as(x)).any()  # no gradient into the padding


# (padding, channels, groups, dtype, layout, affine)
GN_CASES = [
    ("2d", 4, 2, torch.float32, "contiguous", True),
    ("2d", 4, 4, torch.float32, "channels_last", True),
    ("2d", 6, 3, torch.bfloat16, "channels_last", True),
    ("2d", 4, 1, torch.float64, "contiguous", False),
    ("1d", 4, 2, torch.float32, "contiguous", True),
    ("3d", 4, 2, torch.float32, "channels_last", True),
    ("2d-empty-item", 2, 2, torch.float32, "contiguous", True),
    ("2d-unpadded", 4, 2, torch.bfloat16, "contiguous", True),
    ("2d-arbitrary", 4, 2, torch.float32, "contiguous", True),
]


@pytest.mark.parametrize("case", GN_CASES, ids=lambda c: f"{c[0]}-g{c[2]}-{str(c[3])[6:]}-{c[4]}-aff{int(c[5])}")
def test_triton_group_norm_equals_the_torch_code(case):
    """Through the public call: the output (zeros in the padding), the gradients of x, weight and
    bias; the op's per-item, per-group mean and inverse deviation."""
    name, c, groups, dtype, layout, affine = case
    padding = _padding(name)
    x, w, b, dy = _inputs(padding, c, dtype, layout, seed=1)
    mask = padding.mask.unsqueeze(1)

    def call():
        xx = x.clone().requires_grad_()
        ww, bb = (w.clone().requires_grad_(), b.clone().requires_grad_()) if affine else (None, None)
        y = norms.group_norm(xx, padding, groups, ww, bb, 1e-5)
        y.backward(dy)
        _, mean, rstd, _ = GN(x, w if affine else None, b if affine else None, mask, groups, 1e-5)
        return y.detach(), xx.grad, ww.grad if affine else None, bb.grad if affine else None, mean, rstd

    got, want = _run_both(call)
    _assert_all_close(got, want, ["y", "grad_x", "grad_weight", "grad_bias", "mean", "rstd"])
    assert not got[0].masked_select(mask.expand_as(x)).any()


def test_triton_gradients_asked_for_alone():
    """Each backward op computes only the gradients asked for (the others are empty tensors), and
    each one equals the torch code's; a map without padding on either path equals torch's norms."""
    padding = _padding("2d")
    x, w, b, dy = _inputs(padding, 3, torch.float32, "contiguous", seed=2)
    mask = padding.mask.unsqueeze(1)
    for need in ((True, False, False), (False, True, False), (False, False, True)):
        def call(need=need):
            _, mean, invstd, xc = BN(x, w, b, mask, 0, 1e-5, False, 0.1, None, None, None)
            bn = BN_BACKWARD(dy, x if xc.numel() == 0 else None, xc, mask, w, mean, invstd, 0, False, *need)
            _, mean, rstd, centred = GN(x, w, b, mask, 3, 1e-5)
            gn = GN_BACKWARD(dy, x if centred.numel() == 0 else None, centred, mask, w, mean, rstd, 3, *need)
            return (*bn, *gn)

        got, want = _run_both(call)
        for a, b_, asked in zip(got, want, need * 2):
            assert (a.numel() > 0) == asked and (b_.numel() > 0) == asked
        _assert_all_close(got, want, ["bn_x", "bn_w", "bn_b", "gn_x", "gn_w", "gn_b"])
    clean = torch.randn(2, 3, 4, 5)
    with _triton.interpreted():
        y_bn = bn_op.batch_norm(clean, None, None, torch.zeros(2, 1, 4, 5, dtype=torch.bool), 0, 1e-5, False, 0.1,
                              None, None, None)
        y_gn = gn_op.group_norm(clean, None, None, torch.zeros(2, 1, 4, 5, dtype=torch.bool), 3, 1e-5)
    torch.testing.assert_close(y_bn, torch.nn.functional.batch_norm(clean, None, None, training=True))
    torch.testing.assert_close(y_gn, torch.nn.functional.group_norm(clean, 3))


def _training_step(padding, x, w, b, dy, device):
    """Both norms, forward and backward, with running statistics, on ``device``: the outputs, the
    running statistics and the gradients, on the CPU."""
    c = x.shape[1]
    xx, ww, bb = (t.to(device).requires_grad_() for t in (x, w, b))
    rm, rv, tracked = (t.to(device) for t in (torch.zeros(c), torch.ones(c), torch.tensor(2)))
    pad = padding.to(device)
    y_bn = norms.batch_norm(xx, pad, rm, rv, ww, bb, True, None, 1e-5, tracked, False)
    y_gn = norms.group_norm(xx, pad, 1 if c == 3 else 8, ww, bb, 1e-5)
    torch.autograd.backward([y_bn, y_gn], [dy.to(device), dy.to(device)])
    return [t.detach().cpu() for t in (y_bn, y_gn, rm, rv, tracked, xx.grad, ww.grad, bb.grad)]


def _gpu_case(monkeypatch, tiles, dtype, layout):
    """The inputs of the GPU test: small tiles on a test map, or the default tiles on a ResNet-sized
    map (several chunks per channel); 16-bit maps with float32 parameters, as autocast runs them."""
    if tiles == "default":
        for name, value in dict(BLOCK_CELLS=1024, BLOCK_CHANNELS_LAST=32, MIN_CHUNK_BLOCKS=4, MAX_SPLIT=64).items():
            monkeypatch.setattr(geometry, name, value)
        padding, c = Padding.from_sizes([(56, 56), (40, 48), (56, 30), (17, 56)], (56, 56)), 64
    else:
        padding, c = _padding("2d"), 3
    x, w, b, dy = _inputs(padding, c, dtype, layout, seed=3)
    return padding, x, w.float(), b.float(), dy


def _assert_step_close(got, want):
    names = ["bn", "gn", "running_mean", "running_var", "num_batches_tracked", "grad_x", "grad_weight", "grad_bias"]
    for name, a, b in zip(names, got, want):  # sums of ~10^4 terms in another order: float32 round-off
        tol = 2e-2 if a.dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tiles", ["small", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_triton_cuda_kernels_equal_the_cpu_torch_code(monkeypatch, tiles, dtype, layout):
    """On a GPU the compiled kernels (both norms, forward and backward, running statistics) equal
    the torch code run on the CPU."""
    case = _gpu_case(monkeypatch, tiles, dtype, layout)
    _assert_step_close(_training_step(*case, "cuda"), _training_step(*case, "cpu"))


def test_triton_each_op_launches_the_kernels_it_declares():
    """Under the interpreter, one call of each op launches exactly ``_triton.launches(op)`` kernels
    (two), whatever the options (running statistics or not, gradients asked for or not)."""
    padding = _padding("2d")
    x, w, b, dy = _inputs(padding, 3, torch.float32, "contiguous")
    mask = padding.mask.unsqueeze(1)
    rm, rv, tracked = torch.zeros(3), torch.ones(3), torch.tensor(0)
    stats = torch.ones(3, 3)  # (B, G)
    with _triton.interpreted():
        for name, call in [
            ("valid_batch_norm", lambda: BN(x, w, b, mask, 0, 1e-5, False, None, rm, rv, tracked)),
            ("valid_batch_norm", lambda: BN(x, None, None, mask, 0, 1e-5, True, 0.1, None, None, None)),
            ("valid_batch_norm_backward", lambda: BN_BACKWARD(dy, x, x[:0], mask, w, rm, rv, 0, False, True, True,
                                                              True)),
            ("valid_batch_norm_backward", lambda: BN_BACKWARD(dy, x, x[:0], mask, w, rm, rv, 0, True, False, True,
                                                              False)),
            ("valid_group_norm", lambda: GN(x, w, b, mask, 3, 1e-5)),
            ("valid_group_norm_backward", lambda: GN_BACKWARD(dy, x, x[:0], mask, w, stats, stats, 3, True, True,
                                                              True)),
            ("valid_group_norm_backward", lambda: GN_BACKWARD(dy, x, x[:0], mask, None, stats, stats, 3, False,
                                                              False, True)),
        ]:
            with _triton.launch_tally() as tally:
                call()
            assert sum(tally.values()) == _triton.launches(f"vispos::{name}") == 2, (name, dict(tally))
            assert all(count == 1 for count in tally.values()), (name, dict(tally))


class _AtenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


#: aten ops that launch nothing on a GPU: allocation and metadata
_NO_LAUNCH = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view", "_unsafe_view",
              "reshape", "alias", "as_strided", "detach", "slice", "unsqueeze", "expand"}


def test_triton_path_runs_no_torch_compute_op(monkeypatch):
    """The Triton path dispatches allocations and views only besides its kernels (stubbed out here):
    inside the ops, and around them from the public calls through autograd's backward (each op
    once). On a GPU the ops' kernels are a norm's only launches, the running statistics' update
    and the padding mask's reading included."""
    launched = []
    stub = lambda self, grid: lambda *args, **kwargs: launched.append(self.__name__)  # noqa: E731
    monkeypatch.setattr(_triton._Kernel, "__getitem__", stub)
    padding = _padding("2d")
    mask = padding.mask.unsqueeze(1)  # built once per batch by the runner, not per layer
    x, w, b, dy = _inputs(padding, 3, torch.float32, "channels_last")
    rm, rv, tracked = torch.zeros(3), torch.ones(3), torch.tensor(0)
    with _triton.interpreted(), _AtenOps() as inside:  # the ops' own code
        _, mean, invstd, xc = bn_op._bn(x, w, b, mask, 0, 1e-5, False, None, rm, rv, tracked)
        bn_op._bn_bwd(dy, x, xc, mask, w, mean, invstd, 0, False, True, True, True)
        _, mean, rstd, centred = gn_op._gn(x, w, b, mask, 3, 1e-5)
        gn_op._gn_bwd(dy, x, centred, mask, w, mean, rstd, 3, True, True, True)
    assert set(inside.names) <= _NO_LAUNCH, sorted(set(inside.names) - _NO_LAUNCH)
    leaves = [[t.clone().requires_grad_() for t in (x, w, b)] for _ in range(2)]
    with _triton.interpreted(), _AtenOps() as around:  # the public calls, forward and backward
        xx, ww, bb = leaves[0]
        norms.batch_norm(xx, padding, rm, rv, ww, bb, True, None, 1e-5, tracked, True).backward(dy)
        xx, ww, bb = leaves[1]
        norms.group_norm(xx, padding, 3, ww, bb, 1e-5).backward(dy)
    ours = ["valid_batch_norm", "valid_batch_norm_backward", "valid_group_norm", "valid_group_norm_backward"]
    assert sorted(n for n in around.names if n not in _NO_LAUNCH) == ours, around.names
    assert launched == ["_bn_stats", "_bn_apply", "_bn_grad_sums", "_bn_grad_apply", "_gn_stats", "_gn_apply",
                        "_gn_grad_sums", "_gn_grad_apply"] * 2


def test_triton_second_derivative_is_refused():
    padding = _padding("2d")
    x, w, b, _ = _inputs(padding, 3, torch.float64, "contiguous")
    x = x.nan_to_num(0.0, 0.0, 0.0).requires_grad_()
    with _triton.interpreted():
        for fn in (lambda t: norms.batch_norm(t, padding, None, None, w, b, True, 0.1, 1e-5),
                   lambda t: norms.group_norm(t, padding, 3, w, b, 1e-5)):
            (gx,) = torch.autograd.grad(fn(x).square().sum(), x, create_graph=True)
            with pytest.raises(RuntimeError, match="once_differentiable"):
                gx.sum().backward()


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_triton_ops_pass_opcheck(path):
    """``torch.library.opcheck``: schema (declared mutations), fake implementation (shapes,
    strides, dtypes) and dynamic-shape tracing, on the torch path and on the interpreted Triton
    path (no autograd formula is registered on the ops: their autograd is a Function)."""
    padding = _padding("2d")
    x, w, b, dy = _inputs(padding, 4, torch.float32, "channels_last")
    x = x.nan_to_num(0.0, 0.0, 0.0)
    mask = padding.mask.unsqueeze(1)
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    with _triton.interpreted() if path == "triton" else contextlib.nullcontext():
        _, mean, invstd, xc = BN(x, w, b, mask, 0, 1e-5, False, 0.1, None, None, None)
        keep = x if xc.numel() == 0 else None
        torch.library.opcheck(BN, (x, w, b, mask, 0, 1e-5, True, None, torch.zeros(4), torch.ones(4),
                                   torch.tensor(1)), test_utils=tests)
        torch.library.opcheck(BN_BACKWARD, (dy, keep, xc, mask, w, mean, invstd, 0, False, True, True, True),
                              test_utils=tests)
        _, mean, rstd, centred = GN(x, w, b, mask, 2, 1e-5)
        keep = x if centred.numel() == 0 else None
        torch.library.opcheck(GN, (x, w, None, mask, 2, 1e-5), test_utils=tests)
        torch.library.opcheck(GN_BACKWARD, (dy, keep, centred, mask, w, mean, rstd, 2, True, True, False),
                              test_utils=tests)


def test_triton_ops_compose_with_compile_and_export():
    """On the CPU (the torch path): ``torch.compile(fullgraph=True)`` of forward + backward with
    both norms (running statistics updated in the compiled graph) equals eager, and
    ``torch.export`` keeps each norm as one op."""
    padding = _padding("2d")
    mask = padding.mask.unsqueeze(1)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(4, momentum=None)
            self.gn = torch.nn.GroupNorm(2, 4)

        def forward(self, x, mask):
            y = norms.batch_norm_module(x, mask, self.bn, zero_padding=True)
            return norms.group_norm(y, mask, 2, self.gn.weight, self.gn.bias, 1e-5)

    x, _, _, _ = _inputs(padding, 4, torch.float32, "contiguous")
    x = x.nan_to_num(0.0, 0.0, 0.0)
    eager, compiled = Net().train(), Net().train()
    compiled.load_state_dict(eager.state_dict())
    fn = torch.compile(compiled, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yc = eager(xe, mask), fn(xc, mask)
        ye.square().sum().backward()
        yc.square().sum().backward()
        torch.testing.assert_close(yc, ye)
        torch.testing.assert_close(xc.grad, xe.grad)
    for (name, a), (_, b) in zip(compiled.state_dict().items(), eager.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    program = torch.export.export(Net().train(), (x, mask))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"vispos.valid_batch_norm.default", "vispos.valid_group_norm.default"} <= targets, targets


_COMPILE = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vispos.ops import _batch_norm_kernels as bn, _group_norm_kernels as gn

if "nvidia" not in triton.backends.backends:
    sys.exit(3)
pointers = dict(mask_ptr="*i1", nbt_ptr="*i64", w_ptr="*fp32", b_ptr="*fp32", rm_ptr="*fp32", rv_ptr="*fp32",
                gw_ptr="*fp32", gb_ptr="*fp32")
on = dict(HAS_W=True, HAS_B=True, NEED_X=True, NEED_W=True, NEED_B=True, ALL_DY=True, ZERO_PAD=False, UPDATE=True,
          CUMULATIVE=True, BUMP=True, SPLIT_BLOCK=8, BLOCK_C=32, BLOCK_N=32)
for data, stat in (("*bf16", "fp32"), ("*fp64", "fp64")):
    for kernel in (bn._bn_stats, bn._bn_apply, bn._bn_grad_sums, bn._bn_grad_apply, gn._gn_stats, gn._gn_apply,
                   gn._gn_grad_sums, gn._gn_grad_apply):
        fn = triton.jit(kernel.fn)
        constexprs = {k: v for k, v in on.items() if k in fn.arg_names}
        constexprs["STAT"] = tl.float32 if stat == "fp32" else tl.float64
        types = {**dict(x_ptr=data, y_ptr=data, dy_ptr=data, gx_ptr=data), **pointers}
        signature = {n: "constexpr" if n in constexprs else types.get(n, "*" + stat) if n.endswith("_ptr")
                     else "fp32" if n in ("eps", "momentum") else "i32" for n in fn.arg_names}
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        assert triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"], kernel.__name__
"""


def test_triton_kernels_compile_for_a_gpu():
    """The compiled (not interpreted) kernels build for an H100 / H200 (sm_90) on this CPU, PTX and
    ptxas, every option on, channels-last tiles: bfloat16 maps with float32 statistics and float64
    maps with float64 ones (the interpreter does not check what the compiler checks). In a process
    of its own: Triton builds its library functions interpreted or compiled once, at its import."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env)
    if out.returncode == 3:
        pytest.skip("Triton without its NVIDIA backend")
    assert out.returncode == 0, out.stderr[-3000:]


def test_triton_absent_leaves_the_norms_working():
    """Without Triton (CPU-only torch wheels; here ``import triton`` made to fail), ``import vispos``
    works and both norms run forward and backward on their torch code; the kernels' modules are
    imported only by a call that runs them."""
    code = ("import sys\n"
            "sys.modules['triton'] = None  # import triton fails, find_spec finds nothing\n"
            "import torch, vispos\n"
            "from vispos.ops import _triton\n"
            "from vispos.invariance.cells import _norms\n"
            "assert not _triton.available()\n"
            "x = torch.randn(2, 3, 4, 4, requires_grad=True)\n"
            "m = torch.zeros(2, 1, 4, 4, dtype=torch.bool); m[1, :, 2:] = True\n"
            "y = _norms.batch_norm(x, m, torch.zeros(3), torch.ones(3), None, None, True, 0.1, 1e-5)\n"
            "(y + _norms.group_norm(x, m, 3, None, None, 1e-5)).sum().backward()\n"
            "assert x.grad is not None\n"
            "kernels = [n for n in sys.modules if n.endswith('norm_kernels')]\n"
            "assert not kernels, kernels\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_triton_group_norm_refuses_groups_that_do_not_divide_the_channels(path):
    """num_groups must divide C on both paths: the torch path failed in a reshape, the Triton path
    read the statistics of groups that do not exist (out of bounds) and returned its output."""
    x = torch.randn(2, 6, 4, 5)
    mask = torch.zeros(2, 1, 4, 5, dtype=torch.bool)
    with _triton.interpreted() if path == "triton" else contextlib.nullcontext():
        with pytest.raises(ValueError, match="num_groups=4 must divide the 6 channels"):
            gn_op.group_norm(x, None, None, mask, 4, 1e-5)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32])
def test_triton_norms_refuse_a_mask_that_is_not_bool(dtype):
    """A 0/1 mask of another dtype is refused by both norms with a TypeError saying how to convert
    (a uint8 mask was accepted: the torch path read ``~mask`` as 254 / 255, every cell valid, and
    disagreed with the Triton path)."""
    x = torch.randn(2, 4, 4, 5)
    mask = torch.zeros(2, 1, 4, 5, dtype=dtype)
    with pytest.raises(TypeError, match=r"bool .*True = padding.*mask.bool\(\)"):
        bn_op.batch_norm(x, None, None, mask, 0, 1e-5, False, 0.1, None, None, None)
    with pytest.raises(TypeError, match=r"bool .*True = padding.*mask.bool\(\)"):
        gn_op.group_norm(x, None, None, mask, 2, 1e-5)
