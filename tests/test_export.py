"""Export: torch.export with dynamic spatial sizes, ONNX (dynamo exporter) run in onnxruntime
at sizes other than the export size, and TorchScript tracing at a fixed size.

Export traces run with ``vispos._tracing.tracing()`` True: no Python-side cache, no host reads,
so the graphs are not specialised to the example input.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch.export import Dim

from vispos import NestedTensor, PositionEmbeddingSine, nested_tensor_from_tensor_list


class _SineOnMask(torch.nn.Module):
    """Exportable entry point: a bool mask in, the embedding out."""

    def __init__(self, pe):
        super().__init__()
        self.pe = pe

    def forward(self, mask):
        return self.pe(mask)


class _JoinerOnTensors(torch.nn.Module):
    """Exportable entry point for a Joiner: ``(tensors, mask)`` in, every level's features, mask
    and position embedding out (exporters take tensors, not NestedTensors)."""

    def __init__(self, joiner):
        super().__init__()
        self.joiner = joiner

    def forward(self, tensors, mask):
        feats, pos = self.joiner(NestedTensor(tensors, mask))
        return tuple(f.tensors for f in feats) + tuple(f.mask for f in feats) + tuple(pos)


def _tiny_joiner():
    from vispos.backbones import Joiner, TimmBackbone

    torch.manual_seed(0)
    backbone = TimmBackbone("resnet18", out_indices=(3, 4), frozen_batch_norm=True)
    pe = PositionEmbeddingSine(16, normalize=True, offset=-0.5)
    return Joiner(backbone, pe, hidden_dim=32, num_feature_levels=3, num_groups=8).eval()


def _masks(*shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.rand(*s, generator=g) > 0.4 for s in shapes]


def _batch(sizes):
    g = torch.Generator().manual_seed(sum(sum(s) for s in sizes))
    return nested_tensor_from_tensor_list([torch.randn(3, *s, generator=g) for s in sizes])


MASK_DIMS = {"mask": {0: Dim("B", min=1, max=64), 1: Dim("H", min=2, max=4096), 2: Dim("W", min=2, max=4096)}}
# every level of the tiny joiner keeps >= 2 cells per axis from 130 pixels up (stride 64)
_H, _W, _B = Dim("H", min=130, max=2048), Dim("W", min=130, max=2048), Dim("B", min=2, max=16)
JOINER_DIMS = {"tensors": {0: _B, 2: _H, 3: _W}, "mask": {0: _B, 1: _H, 2: _W}}
JOINER_EXAMPLE = [(160, 192), (130, 140)]
JOINER_OTHER = [[(200, 150), (133, 190)], [(256, 140), (140, 256), (131, 131)]]


@pytest.mark.parametrize("normalize, offset", [(True, -0.5), (False, 0.0)])
def test_torch_export_sine_dynamic(normalize, offset):
    pe = PositionEmbeddingSine(16, normalize=normalize, offset=offset)
    (example,) = _masks((2, 20, 24))
    ep = torch.export.export(_SineOnMask(pe), (example,), dynamic_shapes=MASK_DIMS)
    assert len(pe._cache) == 0  # the export trace never touched the cache
    eager = copy.deepcopy(pe)
    for mask in _masks((3, 31, 17), (1, 64, 9), (5, 7, 50)):
        torch.testing.assert_close(ep.module()(mask), eager(mask), rtol=0, atol=1e-6)


def test_torch_export_sine_3d_and_features():
    pe = PositionEmbeddingSine(8, normalize=True)
    dims = {"mask": {0: Dim("B", min=1, max=8), 1: Dim("D", min=2), 2: Dim("H", min=2), 3: Dim("W", min=2)}}
    (example,) = _masks((2, 5, 6, 7))
    ep = torch.export.export(_SineOnMask(pe), (example,), dynamic_shapes=dims)
    for mask in _masks((3, 4, 9, 3), (1, 8, 2, 5)):
        torch.testing.assert_close(ep.module()(mask), PositionEmbeddingSine(8, normalize=True)(mask), rtol=0, atol=1e-6)
    # an unmasked feature map (DETR without padding)
    fdims = {"mask": {0: Dim("B", min=1, max=8), 2: Dim("H", min=2), 3: Dim("W", min=2)}}
    ep = torch.export.export(_SineOnMask(pe), (torch.randn(2, 3, 6, 7),), dynamic_shapes=fdims)
    x = torch.randn(3, 3, 11, 5)
    torch.testing.assert_close(ep.module()(x), pe(x), rtol=0, atol=1e-6)


def test_torch_export_joiner_dynamic():
    model = _TinyCache.joiner()
    nt = _batch(JOINER_EXAMPLE)
    with torch.no_grad():
        ep = torch.export.export(_JoinerOnTensors(model), (nt.tensors, nt.mask), dynamic_shapes=JOINER_DIMS)
        for sizes in JOINER_OTHER:
            b = _batch(sizes)
            got = ep.module()(b.tensors, b.mask)
            ref = _JoinerOnTensors(model)(b.tensors, b.mask)
            assert len(got) == len(ref) == 9
            for g, r in zip(got, ref):
                torch.testing.assert_close(g, r, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ ONNX
def _onnx_session(module, args, dynamic_shapes, path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, dynamic_shapes=dynamic_shapes, dynamo=True, verbose=False)
    program.save(str(path))
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_onnx_sine_with_mask(tmp_path):
    pe = PositionEmbeddingSine(16, normalize=True, offset=-0.5)
    (example,) = _masks((2, 20, 24))
    session = _onnx_session(_SineOnMask(pe), (example,), MASK_DIMS, tmp_path / "sine.onnx")
    name = session.get_inputs()[0].name
    for mask in _masks((3, 31, 17), (1, 64, 90)):  # neither is the export size
        (got,) = session.run(None, {name: mask.numpy()})
        diff = (torch.from_numpy(got) - pe(mask)).abs().max().item()
        assert diff <= 1e-5, diff


@pytest.mark.exhaustive  # ONNX of the masks' sine above, torch.export of the joiner: default run
def test_onnx_backbone_and_joiner(tmp_path):
    model = _TinyCache.joiner()
    nt = _batch(JOINER_EXAMPLE)
    session = _onnx_session(_JoinerOnTensors(model), (nt.tensors, nt.mask), JOINER_DIMS, tmp_path / "joiner.onnx")
    names = [i.name for i in session.get_inputs()]
    assert names == ["tensors", "mask"]
    for sizes in JOINER_OTHER:
        b = _batch(sizes)
        got = session.run(None, {"tensors": b.tensors.numpy(), "mask": b.mask.numpy()})
        with torch.no_grad():
            ref = _JoinerOnTensors(model)(b.tensors, b.mask)
        assert len(got) == len(ref) == 9
        for g, r in zip(got, ref):
            g = torch.from_numpy(g)
            assert g.shape == r.shape and g.dtype == r.dtype
            if r.dtype == torch.bool:
                assert torch.equal(g, r)
            else:
                diff = (g - r).abs().max().item()
                assert diff <= 1e-5, diff


class _TinyCache:
    """One tiny Joiner per test session (building timm's resnet18 takes a moment)."""

    _model = None

    @classmethod
    def joiner(cls):
        if cls._model is None:
            cls._model = _tiny_joiner()
        return cls._model


# ----------------------------------------------------------------------------- TorchScript
def test_torchscript_trace_fixed_size():
    """``torch.jit.script`` does not support the encoders (NestedTensor / Union inputs, Python
    caches: see README "Deployment"); ``torch.jit.trace`` works for one fixed input size."""
    pe = PositionEmbeddingSine(16, normalize=True)
    example, other = _masks((2, 20, 24), (2, 20, 24))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_SineOnMask(pe), (example,), check_trace=False)
    eager = copy.deepcopy(pe)
    torch.testing.assert_close(traced(example), eager(example), rtol=0, atol=0)
    torch.testing.assert_close(traced(other), eager(other), rtol=0, atol=0)  # another mask


def test_tracing_sees_fake_modes_without_detect_fake_mode_on_the_plain_path():
    """_tracing.tracing() skips torch's detect_fake_mode when the mode stack and the tracing
    context are empty (the cheap gate): it must still see a FakeTensorMode, a fake-tensor
    make_fx trace and a non-strict export, and be False on a plain call."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from vispos import _tracing

    assert not _tracing.tracing()
    with FakeTensorMode():
        assert _tracing.tracing()
    seen = []

    def body(x):
        seen.append(_tracing.tracing())
        return x + 1

    make_fx(body, tracing_mode="fake")(torch.zeros(2))

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(_tracing.tracing())
            return x + 1

    torch.export.export(Probe(), (torch.zeros(2),), strict=False)
    assert seen and all(seen)
