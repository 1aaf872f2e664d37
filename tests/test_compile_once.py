"""A padding-invariant backbone compiles once: a new mix of item sizes on the same canvas is new
data for the same graph (the boxes' arithmetic and the masks are built outside it, the graph sees
each map's mask), a new canvas recompiles once (dynamic shapes) and never again; the compiled
model gives the eager model's levels, paddings, gradients and running statistics.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import vispos
from vispos.backbones import TimmBackbone


def _batch(canvas, g):
    """Three images, the first of the canvas's size, the others smaller (a padded batch)."""
    sizes = [canvas] + [tuple(int(v) for v in torch.randint(33, 64, (2,), generator=g)) for _ in range(2)]
    return vispos.nested_tensor_from_tensor_list([torch.randn(3, *s, generator=g) for s in sizes])


def _pair(training):
    torch.manual_seed(0)
    model = TimmBackbone("resnet18", out_indices=(2, 3, 4), padding_invariant=True).train(training)
    eager = TimmBackbone("resnet18", out_indices=(2, 3, 4), padding_invariant=True).train(training)
    eager.load_state_dict(model.state_dict())
    return model, eager


def _assert_same_step(got, want, model, eager):
    """The compiled model's levels and paddings, then (after a backward of both) its parameter
    gradients and buffers, equal the eager twin's; both models' gradients are cleared after."""
    for a, b in zip(got, want, strict=True):
        assert a.padding == b.padding
        torch.testing.assert_close(a.tensors, b.tensors)
    sum(level.tensors.sum() for level in got).backward()
    sum(level.tensors.sum() for level in want).backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4 * float(q.grad.abs().max()), msg=name)
    for a, b in zip(model.buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(a, b)
    model.zero_grad()
    eager.zero_grad()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_invariant_training_step_compiles_once_for_eight_mixes_of_item_sizes():
    model, eager = _pair(training=True)
    counter = CompileCounterWithBackend("aot_eager")  # autograd traced, as inductor sees it
    compiled = torch.compile(model, backend=counter)
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        batch = _batch((64, 64), g)
        _assert_same_step(compiled(batch), eager(batch), model, eager)
    assert counter.frame_count == 1


def test_compiled_invariant_backbone_recompiles_once_for_a_new_canvas_then_never():
    model, eager = _pair(training=False)
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter)
    g = torch.Generator().manual_seed(1)
    frames = []
    for canvas in [(64, 64), (64, 64), (96, 80), (80, 96), (128, 64), (96, 96)]:
        batch = _batch(canvas, g)
        with torch.no_grad():
            got, want = compiled(batch), eager(batch)
        for a, b in zip(got, want):
            assert a.padding == b.padding
            torch.testing.assert_close(a.tensors, b.tensors)
        frames.append(counter.frame_count)
    assert frames[0] == frames[1], frames  # a new mix on the same canvas: no recompile
    assert frames[2] == frames[-1], frames  # after the second canvas (dynamic shapes): none


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_small_patch16_224", "vit_small_patch16_rope_224"])
def test_compiled_invariant_vit_training_step_compiles_once_for_eight_mixes_of_item_grids(name):
    kwargs = dict(out_indices=(1, 3), padding_invariant=True,
                  model_kwargs={"dynamic_img_size": True, "depth": 4, "embed_dim": 64, "num_heads": 2})
    torch.manual_seed(0)
    model = TimmBackbone(name, **kwargs).train()
    eager = TimmBackbone(name, **kwargs).train()
    eager.load_state_dict(model.state_dict())
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    g = torch.Generator().manual_seed(0)
    frames = []
    for _ in range(8):
        sizes = [(64, 64)] + [tuple(16 * int(v) for v in torch.randint(1, 5, (2,), generator=g)) for _ in range(2)]
        batch = vispos.nested_tensor_from_tensor_list([torch.randn(3, *s, generator=g) for s in sizes])
        torch.manual_seed(1)  # the same dropout / coordinate draws in both
        got = compiled(batch)
        torch.manual_seed(1)
        _assert_same_step(got, eager(batch), model, eager)
        frames.append(counter.frame_count)
    assert frames[0] == frames[-1], frames


def test_importing_vispos_does_not_import_dynamo():
    """The graph boundaries are marked lazily (``_tracing.outside_graph``): importing vispos, its
    invariance package and the core names does not import TorchDynamo (about a second)."""
    import subprocess
    import sys

    code = ("import sys, vispos, vispos.invariance; vispos.PositionEmbeddingSine; vispos.Padding; "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
