"""An invariant training step is capturable in a CUDA graph once its batch's boxes are on the host:
nothing in it reads device memory on the host. On the CPU this runs the step, the fused ops on their
GPU code path (Triton launches replaced by a no-op), on ``meta`` tensors, which hold no data: any
``.item()``, ``.tolist()``, host copy or data-dependent shape would raise there, and a
``TorchDispatchMode`` checks that no op that synchronises (``_local_scalar_dense``, ``nonzero``,
``is_nonzero``, ``equal``) is dispatched. Where CUDA exists, the step is captured and replayed."""

import contextlib

import pytest
import torch
import torchvision
from torch.utils._python_dispatch import TorchDispatchMode

import vispos
from vispos import PositionEmbeddingSine
from vispos.ops import _triton
from trained_norms import trained_like

SYNCING = {"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.is_nonzero", "aten.equal",
           "aten._assert_async"}


class _Syncs(TorchDispatchMode):
    """Records every dispatched op that reads device memory on the host."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in SYNCING:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _gpu_path_on_meta(monkeypatch):
    """Meta tensors take the fused ops' GPU code path; every launch is a no-op."""
    use = _triton.use_triton
    monkeypatch.setattr(_triton, "use_triton", lambda t: t.device.type == "meta" or use(t))
    monkeypatch.setattr(_triton._Kernel, "__getitem__", lambda self, grid: (lambda *args, **kwargs: None))
    with _Syncs() as mode:
        yield mode


def _batch():
    g = torch.Generator().manual_seed(0)
    return vispos.nested_tensor_from_tensor_list([torch.randn(3, 64, 56, generator=g),
                                                  torch.randn(3, 48, 64, generator=g)])


def test_invariant_training_step_reads_no_device_memory_on_the_host(monkeypatch):
    """resnet18 (batch norms with trained-like statistics), forward and backward in training, on
    meta tensors once the batch's boxes are on the host: it runs, and no syncing op is dispatched."""
    torch.manual_seed(0)
    net = trained_like(torchvision.models.resnet18(num_classes=5)).train()
    inv = vispos.make_padding_invariant(net)
    nested = _batch()
    assert nested.padding.kind == "rectangular"
    net.to("meta")
    nested = nested.to("meta")
    with _gpu_path_on_meta(monkeypatch) as mode:
        out = inv(nested)
        out.sum().backward()
    assert out.shape == (2, 5) and out.device.type == "meta"
    assert net.conv1.weight.grad is not None
    assert mode.seen == []


def test_sine_embedding_reads_no_device_memory_on_the_host(monkeypatch):
    """The sine embedding's kernel path (boxes from the host facts), through a NestedTensor, on meta."""
    pe = PositionEmbeddingSine(16, normalize=True, cache_size=0).to("meta")
    nested = _batch().to("meta")
    with _gpu_path_on_meta(monkeypatch) as mode:
        pos = pe(nested)
    assert pos.shape == (2, 32, 64, 64) and mode.seen == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_invariant_training_step_is_captured_in_a_cuda_graph():
    """On CUDA: the invariant resnet18's training step (forward, backward) captured once, replayed on
    new contents of the same batch, gives the eager step's loss and gradients."""
    torch.manual_seed(0)
    net = trained_like(torchvision.models.resnet18(num_classes=5)).cuda().train()
    inv = vispos.make_padding_invariant(net)
    nested = _batch().to("cuda")
    static = nested.tensors
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up: kernels compiled, caches filled
            net.zero_grad(set_to_none=False)
            inv(nested).square().mean().backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    net.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        loss = inv(nested).square().mean()
        loss.backward()
    fresh = torch.randn_like(static)
    static.copy_(fresh)
    net.zero_grad(set_to_none=False)
    graph.replay()
    got = (loss.detach().clone(), net.conv1.weight.grad.clone())
    net.zero_grad(set_to_none=False)
    want_loss = inv(vispos.NestedTensor(fresh, nested.mask)).square().mean()
    want_loss.backward()
    torch.testing.assert_close(got[0], want_loss.detach(), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(got[1], net.conv1.weight.grad, rtol=1e-3, atol=1e-4)
