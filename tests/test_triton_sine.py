"""DETR's sine embedding in one Triton kernel per level (``vispos/ops/sine.py``, ``vispos/encodings/_sine_op.py`` and
``vispos/ops/_sine_kernels.py``): the kernel, run on the CPU by Triton's interpreter, gives the torch path's
numbers (and transformers'), the custom ops' torch implementation gives them bit for bit, the
ops declare the launches they make, and DETR's C5 level costs at most 4 launches through a
NestedTensor and 6 through a bool mask on the CUDA code path (counted on the CPU).

Every test name holds ``triton`` (``pytest -k triton``); the interpreted ones skip without Triton.
"""

import math

import pytest
import torch
from transformers.models.deformable_detr.modeling_deformable_detr import DeformableDetrSinePositionEmbedding
from transformers.models.detr.modeling_detr import DetrSinePositionEmbedding

import vispos._tracing as core
from benchmarks._measure import count_device_ops
from vispos import NestedTensor, Padding, PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos.ops import _triton
from vispos._sincos import frequency_divisors
from vispos.encodings import _sine_op


needs_triton = pytest.mark.skipif(not _triton.available(), reason="needs Triton (pip install triton)")
# fully padded items are among the inputs on purpose
pytestmark = pytest.mark.filterwarnings("ignore:an item of the batch has no valid cell:UserWarning")


def _rect(sizes, spatial, starts=None):
    return NestedTensor(torch.zeros(len(sizes), 1, *spatial), Padding.from_sizes(sizes, spatial, starts=starts))


def _holes(mask, seed=0, rate=0.3):
    g = torch.Generator().manual_seed(seed)
    return mask | (torch.rand(mask.shape, generator=g) < rate)


INPUTS = {
    "origin 2D": lambda: _rect([(5, 7), (3, 6), (4, 2)], (5, 7)),
    "symmetric 2D": lambda: _rect([(5, 7), (3, 4), (1, 5)], (5, 7), starts="symmetric"),
    "fully padded item 2D": lambda: _rect([(4, 6), (0, 0)], (4, 6)),
    "no padding 2D": lambda: NestedTensor(torch.zeros(2, 1, 3, 5), None),
    "holes 2D": lambda: _holes(_rect([(5, 7), (4, 3)], (5, 7)).mask),
    "holes and an empty item 2D": lambda: torch.cat([_holes(torch.zeros(1, 6, 5, dtype=torch.bool)),
                                                     torch.ones(1, 6, 5, dtype=torch.bool)]),
    "origin 3D": lambda: _rect([(3, 4, 5), (2, 1, 3)], (3, 4, 5)),
    "symmetric 3D": lambda: _rect([(3, 4, 5), (1, 2, 3)], (3, 4, 5), starts="symmetric"),
    "holes 3D": lambda: _holes(_rect([(3, 4, 5), (2, 3, 2)], (3, 4, 5)).mask, seed=1),
    "origin 1D": lambda: _rect([(7,), (3,), (0,)], (7,)),
    "holes 1D": lambda: _holes(torch.zeros(3, 9, dtype=torch.bool), seed=2),
}
RULES = {
    "detr": dict(normalize=False),
    "detr normalized": dict(normalize=True),
    "deformable": dict(normalize=True, offset=-0.5),
    "scale, eps, temperature": dict(normalize=True, scale=3.0, eps=1e-3, temperature=20),
    "offset, not normalized": dict(normalize=False, offset=-1.0),
}


def _interpreted(pe, x, **kwargs):
    with _triton.interpreted(), _triton.launch_tally() as tally:
        got = pe(x, **kwargs)
    assert sum(tally.values()) == 1, dict(tally)  # one launch per level
    return got


@needs_triton
@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", list(INPUTS))
def test_triton_kernel_equals_the_torch_path(name, rule):
    x = INPUTS[name]()
    kwargs = dict(RULES[rule])
    temperature = kwargs.pop("temperature", 10000)
    pe = PositionEmbeddingSine(8, temperature, cache_size=0, **kwargs)
    torch.testing.assert_close(_interpreted(pe, x), pe(x))


@needs_triton
@pytest.mark.parametrize("name", ["origin 2D", "symmetric 2D", "fully padded item 2D", "no padding 2D", "holes 2D",
                                  "holes and an empty item 2D"])
@pytest.mark.parametrize("peer", [DetrSinePositionEmbedding, DeformableDetrSinePositionEmbedding])
def test_triton_kernel_equals_transformers(name, peer):
    x = INPUTS[name]()
    mask = x.padding.mask if isinstance(x, NestedTensor) else x
    deformable = peer is DeformableDetrSinePositionEmbedding
    pe = PositionEmbeddingSine(16, normalize=True, offset=-0.5 if deformable else 0.0, cache_size=0)
    shape = (mask.shape[0], 1, *mask.shape[1:])
    ref = peer(16, 10000, True)(shape, mask.device, torch.float32, (~mask).long())
    torch.testing.assert_close(_interpreted(pe, x), ref)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", ["symmetric 2D", "holes 2D"])
def test_triton_kernel_output_dtype_rounds_float32_angles_once(name, dtype):
    x, pe = INPUTS[name](), PositionEmbeddingSine(8, normalize=True, offset=-0.5, cache_size=0)
    got = _interpreted(pe, x, dtype=dtype)
    assert got.dtype == dtype
    torch.testing.assert_close(got, pe(x, dtype=dtype))


@needs_triton
@pytest.mark.parametrize("normalize, extent", [(False, None), (True, 20.0)])
@pytest.mark.parametrize("name", ["symmetric 3D", "holes 3D"])
def test_triton_kernel_with_spacing_and_extent(name, normalize, extent):
    x = INPUTS[name]()
    pe = PositionEmbeddingSine(8, normalize=normalize, extent=extent, cache_size=0)
    spacing = torch.tensor([[2.0, 0.5, 1.25], [0.7, 3.0, 1.0]])
    torch.testing.assert_close(_interpreted(pe, x, spacing=spacing), pe(x, spacing=spacing))
    one_row = [0.8, 1.5, 2.0]  # every item's (an expanded tensor: stride 0 over the batch)
    torch.testing.assert_close(_interpreted(pe, x, spacing=one_row), pe(x, spacing=one_row))


@needs_triton
@pytest.mark.parametrize("op", ["boxes", "counts"])
def test_triton_kernel_computes_float64_angles_on_request(op):
    mask = INPUTS["symmetric 2D"]().mask
    div = frequency_divisors(8, 100.0, dtype=torch.float64)
    out = torch.empty(mask.shape[0], 16, *mask.shape[1:])
    padding = Padding.from_mask(mask)
    boxes = torch.tensor([(*a, *b) for a, b in zip(padding.starts, padding.stops)], dtype=torch.int32)
    counts = [mask.cumsum(i + 1, dtype=torch.int32) for i in range(2)]
    args = (div, None, True, 2 * math.pi, -0.5, 1e-6, None)

    def call(target):
        if op == "boxes":
            _sine_op.sine_boxes(target, boxes, *args)
        else:
            _sine_op.sine_counts(target, counts, *args)
        return target

    ref = call(torch.empty_like(out))  # the ops' torch implementation, float64 angles
    with _triton.interpreted():
        got = call(out)
    torch.testing.assert_close(got, ref)
    float32 = PositionEmbeddingSine(8, 100.0, normalize=True, offset=-0.5, cache_size=0)(mask)
    assert not torch.equal(ref, float32)  # the angles' precision shows in the last bits


@needs_triton
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("name", ["origin 2D", "holes 2D"])
def test_triton_kernel_writes_the_out_buffer(name, contiguous):
    x, pe = INPUTS[name](), PositionEmbeddingSine(8, normalize=True, cache_size=0)
    expected = pe(x)
    if contiguous:
        out = torch.full_like(expected, float("nan"))
    else:  # channels last: written through a copy
        out = torch.full_like(expected, float("nan")).to(memory_format=torch.channels_last)
    got = _interpreted(pe, x, out=out)
    assert got is out
    torch.testing.assert_close(out, expected)


@needs_triton
def test_triton_kernel_odd_sizes_and_several_programs():
    """Sizes that fill no tile evenly, several tiles per item and several frequency chunks."""
    mask = _holes(_rect([(37, 150), (20, 131), (1, 1)], (37, 150)).mask, rate=0.05)
    pe = PositionEmbeddingSine(20, normalize=True, offset=-0.5, cache_size=0)
    torch.testing.assert_close(_interpreted(pe, mask), pe(mask))
    nt = _rect([(37, 150), (20, 131), (1, 1)], (37, 150), starts="symmetric")
    torch.testing.assert_close(_interpreted(pe, nt), pe(nt))


@needs_triton
def test_triton_path_keeps_the_cache_and_hands_out_owned_results():
    """Only the miss path changes: a hit is served from the cache, and no two calls share storage."""
    x, pe = INPUTS["symmetric 2D"](), PositionEmbeddingSine(8, normalize=True)
    with _triton.interpreted(), _triton.launch_tally() as tally:
        results = [pe(x) for _ in range(3)]
    assert sum(tally.values()) == 2 and pe.cache_info().hits == 1  # the third call is a hit
    assert len({r.data_ptr() for r in results}) == 3
    results[0].fill_(7.0)
    torch.testing.assert_close(results[2], PositionEmbeddingSine(8, normalize=True, cache_size=0)(x))


@needs_triton
@pytest.mark.parametrize("n, mode, out, angles", [
    (2, 1, "*fp32", "*fp32"), (3, 2, "*fp32", "*fp32"), (1, 0, "*bf16", "*fp64"), (1, 2, "*fp16", "*fp32"),
], ids=["2D boxes", "3D counts", "1D none bf16 float64 angles", "1D counts fp16"])
def test_triton_kernel_compiles_for_a_gpu_with_precise_maths(n, mode, out, angles, monkeypatch):
    """The compiled (not interpreted) kernel builds for an H100 / H200 (sm_90) on this CPU, and its
    maths are the precise ones torch's CUDA kernels use: correctly rounded divisions and libdevice's
    sin / cos (no ``.approx`` instruction), so a GPU gives the torch path's numbers."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # triton.jit compiles (the tests' default interprets)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vispos.ops._sine_kernels import sine_embed_kernel

    if "nvidia" not in triton.backends.backends:
        pytest.skip("Triton without its NVIDIA backend")
    signature = {name: "i32" for name in triton.jit(sine_embed_kernel).arg_names}
    signature.update({name: "*i32" for name in ("boxes_ptr", "counts0_ptr", "counts1_ptr", "counts2_ptr")})
    signature.update(out_ptr=out, div_ptr=angles, spacing_ptr="*fp32")
    signature.update({name: "fp32" for name in ("offset", "eps", "scale", "extent")})
    constexprs = dict(N_AXES=n, MODE=mode, NORMALIZE=True, HAS_OFFSET=True, HAS_SPACING=n == 3, HAS_EXTENT=False,
                      ANGLES_64=angles == "*fp64", BLOCK_R=1 if n == 1 else 16, BLOCK_W=64, KC=8)
    signature.update({name: "constexpr" for name in constexprs})
    source = ASTSource(fn=triton.jit(sine_embed_kernel), signature=signature, constexprs=constexprs)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False}).asm["ptx"]
    assert "div.rn.f32" in ptx or "div.rn.f64" in ptx
    assert "approx" not in ptx and "div.full" not in ptx


# --------------------------------------------------------------------- the ops' torch code

@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", list(INPUTS))
def test_triton_ops_torch_code_equals_the_torch_path_bit_for_bit(monkeypatch, name, rule):
    """With the host-side shortcuts off (the CUDA code path) the ops run their torch code on the
    CPU: the same float32 steps as the torch path, hence the same bits."""
    x = INPUTS[name]()
    kwargs = dict(RULES[rule])
    temperature = kwargs.pop("temperature", 10000)
    pe = PositionEmbeddingSine(8, temperature, cache_size=0, **kwargs)
    expected = pe(x)
    monkeypatch.setattr(core, "host_side", lambda device: False)
    assert _sine_op.takes_kernel(pe.dim_t)
    torch.testing.assert_close(pe(x), expected, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_triton_ops_under_torch_compile_fullgraph(monkeypatch, backend):
    """On the CUDA code path ``torch.compile(fullgraph=True)`` traces the call with the ops in it
    (their fake implementation; the mutation functionalised by ``aot_eager``), same numbers."""
    mask, pe = INPUTS["holes 2D"](), PositionEmbeddingSine(8, normalize=True, offset=-0.5, cache_size=0)
    expected = pe(mask)
    monkeypatch.setattr(core, "host_side", lambda device: False)
    compiled = torch.compile(lambda m: pe(m), fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(mask), expected, rtol=0, atol=0)


def test_triton_ops_pass_opcheck():
    """Schema, fake (meta) implementation and mutation as ``torch.library`` checks them."""
    mask = INPUTS["holes 2D"]()
    div = frequency_divisors(8, 10000.0)
    out = torch.empty(mask.shape[0], 16, *mask.shape[1:])
    boxes = torch.tensor([[0, 0, 5, 7], [1, 2, 4, 5]], dtype=torch.int32)
    counts = [mask.cumsum(i + 1, dtype=torch.int32) for i in range(2)]
    torch.library.opcheck(torch.ops.vispos.sine_boxes.default, (out, boxes, div, None, True, 6.28, -0.5, 1e-6, None))
    torch.library.opcheck(torch.ops.vispos.sine_counts.default, (out, counts, div, None, False, 6.28, 0.0, 1e-6, None))


# ----------------------------------------------------------------------------- launch counts

@needs_triton
@pytest.mark.parametrize("name", ["origin 2D", "holes 3D", "no padding 2D"])
def test_triton_declared_launches_equal_the_launch_tally(name):
    x, pe = INPUTS[name](), PositionEmbeddingSine(8, normalize=True, cache_size=0)
    for qualname, (op, args) in _op_calls(x, pe).items():
        with _triton.interpreted(), _triton.launch_tally() as tally:
            op(*args)
        assert sum(tally.values()) == _triton.launches(qualname) == 1, (qualname, dict(tally))


def _op_calls(x, pe):
    padding = x.padding if isinstance(x, NestedTensor) else Padding.from_mask(x)
    mask, n = padding.mask, len(padding.spatial)
    out = torch.empty(padding.batch, n * 8, *padding.spatial)
    rule = (None, True, 2 * math.pi, 0.0, 1e-6, None)
    boxes = torch.tensor([(*a, *b) for a, b in zip(padding.starts, padding.stops)], dtype=torch.int32)
    counts = [mask.cumsum(i + 1, dtype=torch.int32) for i in range(n)]
    return {
        _sine_op.BOXES: (_sine_op.sine_boxes, (out, boxes, pe.dim_t, *rule)),
        _sine_op.COUNTS: (_sine_op.sine_counts, (out, counts, pe.dim_t, *rule)),
    }


def _c5(batch=2, size=(25, 34)):
    """DETR's C5 level: items of their own sizes, padded at the end (stride 32)."""
    sides = [(size[0] * 32, size[1] * 32), (size[0] * 32 - 96, size[1] * 32 - 200)] * batch
    nt = nested_tensor_from_tensor_list([torch.zeros(1, *s) for s in sides[:batch]])
    return nt.with_features(torch.empty(batch, 1, *size))


@pytest.mark.parametrize("offset", [0.0, -0.5], ids=["detr", "deformable"])
@pytest.mark.parametrize("make_input, most", [
    (_c5, 4),
    (lambda: _c5().mask, 6),
    (lambda: _holes(_c5().mask, rate=0.05), 6),
    (lambda: _c5(batch=8), 4),
    (lambda: _c5(batch=8).mask, 6),
], ids=["nested B=2", "bool mask B=2", "holes B=2", "nested B=8", "bool mask B=8"])
def test_triton_c5_launches_on_the_cuda_path(make_input, most, offset):
    """Kernels a GPU would launch for DETR's C5 (B x 256 x 25 x 34), counted on the CPU with the
    CUDA code paths chosen (``count_device_ops``: host-to-device copies included, allocations
    excluded, a custom op weighed by its declared launches). The torch path launched 6 (nested)
    and 15 (bool mask). The count does not grow with the batch."""
    pe, x = PositionEmbeddingSine(128, normalize=True, offset=offset, cache_size=0), make_input()
    n, ops = count_device_ops(lambda: pe(x), launches=True)
    assert n <= most, dict(ops)
    assert sum(v for k, v in ops.items() if k.startswith("vispos::")) == 1, dict(ops)  # one kernel
    if isinstance(x, NestedTensor):
        assert dict(ops) == {"vispos::sine_boxes": 1, "host-to-device copy": 1}
    else:
        assert dict(ops) == {"vispos::sine_counts": 1, "cumsum": 2}


def test_triton_3d_volume_and_feature_map_launches():
    vol = nested_tensor_from_tensor_list([torch.zeros(1, 16, 12, 10), torch.zeros(1, 9, 12, 7)])
    pe = PositionEmbeddingSine(32, normalize=True, cache_size=0)
    assert count_device_ops(lambda: pe(vol), launches=True)[0] == 2  # the boxes' copy, the kernel
    assert count_device_ops(lambda: pe(vol.mask), launches=True)[0] == 4  # 3 cumsums, the kernel
    features = torch.zeros(4, 8, 25, 34)  # one unbatched table, copied into the caller's batch
    n, ops = count_device_ops(lambda: pe(features), launches=True)
    assert n == 2 and dict(ops) == {"vispos::sine_boxes": 1, "copy_": 1}
