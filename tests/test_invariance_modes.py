"""Deep copies, pickles and state-dict round trips of the backbone adapters keep the train / eval
mode of every graph and module (vispos.invariance.tracing._mode_graphs), tested as an EMA uses them."""

import copy
import pickle

import pytest
import torch
from torch import nn
from trained_norms import trained_like

from vispos import NestedTensor, nested_tensor_from_tensor_list
from vispos.backbones import TimmBackbone, TorchvisionBackbone, VolumeBackbone


BUILDERS = {
    "torchvision": lambda pi: TorchvisionBackbone("resnet18", return_interm_layers=True, padding_invariant=pi),
    "timm": lambda pi: TimmBackbone("resnet18", out_indices=(2, 3), padding_invariant=pi),
    "volume": lambda pi: VolumeBackbone("r3d_18", return_nodes=["layer1", "layer2"], padding_invariant=pi),
}
CASES = [(name, pi) for name in BUILDERS for pi in (False, True)]


def _build(name, pi):
    torch.manual_seed(0)
    return trained_like(BUILDERS[name](pi))


def _batch(name):
    g = torch.Generator().manual_seed(1)
    shapes = [(1, 12, 20, 18), (1, 16, 14, 22)] if name == "volume" else [(3, 50, 42), (3, 38, 60)]
    return nested_tensor_from_tensor_list([torch.randn(s, generator=g) for s in shapes])


def _stats(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def _modes(model):
    return {n: m.training for n, m in model.named_modules()}


def _graph_mode(body):
    """'train' / 'eval': which graph a traced body runs (None for an eager body)."""
    if not hasattr(body, "train_graph"):
        return None
    return "train" if body.graph is body.train_graph else "eval"


def _forward(model, batch):
    with torch.no_grad():
        return [level.tensors for level in model(batch)]


def _copies():
    return {"deepcopy": copy.deepcopy, "pickle": lambda m: pickle.loads(pickle.dumps(m))}


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("name, pi", CASES)
def test_ema_copy_of_eval_model_stays_in_eval(name, pi, how):
    """An EMA keeps a copy of an eval model: its forward must use the running statistics and
    leave them alone, and give what the original gives."""
    model = _build(name, pi).eval()
    ema = _copies()[how](model)
    assert _modes(ema) == _modes(model)
    assert _graph_mode(ema.body) == _graph_mode(model.body) in (None, "eval")
    batch = _batch(name)
    before = _stats(ema)
    got, ref = _forward(ema, batch), _forward(model, batch)
    for key, value in _stats(ema).items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, msg=key)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ema.train()  # a copy still switches graphs
    assert _graph_mode(ema.body) in (None, "train") and all(_modes(ema).values())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("name, pi", [("torchvision", False), ("torchvision", True), ("timm", True)])
def test_copy_keeps_mixed_modes(name, pi, how):
    """A training model with one batch norm kept in eval (frozen statistics): the copy too."""
    model = _build(name, pi).train()
    frozen = next(n for n, m in model.body.named_modules() if isinstance(m, nn.BatchNorm2d))
    model.body.get_submodule(frozen).eval()
    clone = _copies()[how](model)
    assert _modes(clone) == _modes(model) and not clone.body.get_submodule(frozen).training
    assert _graph_mode(clone.body) == "train"
    batch = _batch(name)
    twin = copy.deepcopy(model)
    for a, b in zip(_forward(clone, batch), _forward(twin, batch)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(_stats(clone), _stats(twin), rtol=0, atol=0)


@pytest.mark.parametrize("name, pi", CASES)
def test_state_dict_round_trip_into_a_fresh_backbone(name, pi):
    model = _build(name, pi).eval()
    fresh = BUILDERS[name](pi)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    batch = _batch(name)
    for a, b in zip(_forward(fresh, batch), _forward(model, batch)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert _graph_mode(fresh.body) in (None, "eval")


def test_pickled_copy_keeps_both_graphs_and_the_training_branch():
    """A graph traced in each mode (DropPath bakes its branch in): after pickling in eval mode the
    copy still runs the training graph after ``train()``."""
    model = TorchvisionBackbone("resnet18", padding_invariant=True).eval()
    clone = pickle.loads(pickle.dumps(model))
    assert clone.body.train_graph is not clone.body.eval_graph
    clone.train()
    assert clone.body.graph is clone.body.train_graph and clone.body.training
    x = NestedTensor(torch.randn(2, 3, 40, 40), None)
    model.train()
    torch.testing.assert_close(_forward(clone, x), _forward(model, x), rtol=0, atol=0)
