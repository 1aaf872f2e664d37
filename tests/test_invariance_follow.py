"""vispos.make_padding_invariant follows the model it wraps, or refuses at call time: a hook
registered or removed after wrapping (on any module, or globally), a submodule replaced at any
depth, and a module whose traced code branches on its mode put in another mode are refused,
naming the module; ``train()`` / ``eval()`` on the model or the wrapper is seen by both. The
probe compares the items in eval and in training (a hook acting in training only is caught), and
zero preservation is checked on the layer's own arguments (``nn.Hardtanh(0.5, 2)`` keeps no zero).
Each case gave a silently wrong output before (float64, trained-like batch norms)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import vispos

from padded_batch import assert_item_alone, padded_batch
from trained_norms import trained_like


class _Tiny(nn.Module):
    """A ResNet in miniature: stem convolution, batch norm, a nested block, a pooled linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.layer1 = nn.Sequential(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()))
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        x = self.layer1(self.bn1(self.conv1(x)).relu())
        return self.fc(x.mean((2, 3)))


def _tiny():
    torch.manual_seed(0)
    return trained_like(_Tiny()).double().eval()


def _item(size=(6, 7), channels=3, seed=0):
    return torch.randn(channels, *size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _chain():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1)).double().eval()


_REDO = r"call vispos\.make_padding_invariant\(model\) again"


@pytest.mark.parametrize("where, register, hook", [
    ("2", "register_forward_pre_hook", lambda m, a: (a[0] + 1.0,)),   # was off by 0.31
    ("1", "register_forward_hook", lambda m, a, o: o + 1.0),           # was off by 0.27
    ("0", "register_full_backward_hook", lambda m, gi, go: None),
])
def test_a_hook_registered_after_wrapping_is_refused_by_name(where, register, hook):
    net = _chain()
    inv = vispos.make_padding_invariant(net)
    batch = padded_batch(_item(), (9, 5))
    handle = getattr(net.get_submodule(where), register)(hook)
    name = type(net.get_submodule(where)).__name__
    with pytest.raises(RuntimeError, match=rf"hooks were registered on or removed from {where} \({name}\).*{_REDO}"):
        inv(batch)
    handle.remove()
    with torch.no_grad():
        assert_item_alone(net(_item()[None]), inv(batch))  # removed: it runs, exact


def test_a_hook_removed_after_wrapping_and_global_hooks_are_refused():
    net = _chain()
    handle = net[1].register_forward_hook(lambda m, a, o: o * 2.0)  # keeps zeros zero: checked by the probe
    inv = vispos.make_padding_invariant(net)
    batch = padded_batch(_item(), (9, 5))
    with torch.no_grad():
        assert_item_alone(net(_item()[None]), inv(batch))
    handle.remove()
    with pytest.raises(RuntimeError, match=r"removed from 1 \(ReLU\)"):
        inv(batch)
    inv = vispos.make_padding_invariant(net)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        with pytest.raises(RuntimeError, match=r"torch's global module hooks .* changed"):
            inv(batch)
    finally:
        handle.remove()
    inv(batch)


def test_a_hook_acting_in_training_only_is_caught_by_the_probe():
    """The probe compares the items in training mode too (it compared eval only: error 0.126)."""
    net = _chain()
    net[1].register_forward_hook(lambda m, a, o: o + 1.0 if m.training else None)
    with pytest.raises(ValueError, match=r"cannot make Sequential exact.*\(training mode\).*Likely: hooks on 1"):
        vispos.make_padding_invariant(net)


class _TrainingOnly(nn.Module):
    """A layer that runs in training mode only, between two convolutions."""

    def __init__(self, act):
        super().__init__()
        self.c1, self.act, self.c2 = nn.Conv2d(3, 4, 3, padding=1), act, nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        x = self.c1(x)
        if self.training:
            x = self.act(x)
        return self.c2(x)


class _Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(F.hardtanh(self.c1(x), 0.5, 2.0))


@pytest.mark.parametrize("make", [
    lambda: _TrainingOnly(nn.Hardtanh(0.5, 2.0)),  # in a training-only branch: was off by 0.185
    lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Hardtanh(0.5, 2.0), nn.Conv2d(4, 4, 3, padding=1)),
    lambda: _Functional(),
    lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.LeakyReLU(0.1), nn.Conv2d(4, 4, 3, padding=1)),
], ids=["training-branch", "module", "function", "leaky-relu"])
@pytest.mark.parametrize("training", [False, True])
def test_zero_preservation_is_checked_on_the_layers_own_arguments(make, training):
    """hardtanh(0) = 0.5: the padding is filled before the convolution that reads it, not before
    the activation (its class claims zeros kept zero)."""
    torch.manual_seed(0)
    net = make().double().train(training)
    inv = vispos.make_padding_invariant(net)
    item = _item()
    with torch.no_grad():
        assert_item_alone(net(item[None]), inv(padded_batch(item, (9, 5))))


def test_a_child_replaced_after_wrapping_is_refused_at_any_depth():
    """A replaced top-level child was run as the old one (a resnet18's new fc: logits off by 1.87)."""
    from torchvision.ops import FrozenBatchNorm2d

    net = _tiny()
    inv = vispos.make_padding_invariant(net)
    batch = padded_batch(_item(), (9, 5))
    for path, new in (("fc", nn.Linear(4, 5)), ("bn1", FrozenBatchNorm2d(4)), ("layer1.0.1", nn.BatchNorm2d(4))):
        parent, _, leaf = path.rpartition(".")
        owner = net.get_submodule(parent) if parent else net
        old = getattr(owner, leaf)
        setattr(owner, leaf, new.double())
        with pytest.raises(RuntimeError, match=rf"its submodule {path} was replaced \(a {type(new).__name__} where it "
                                               rf"was wrapped with a {type(old).__name__}\).*{_REDO}"):
            inv(batch)
        setattr(owner, leaf, old)
        inv(batch)
    inv.fc = nn.Linear(4, 5).double()  # the wrapper's own child
    with pytest.raises(RuntimeError, match=r"its submodule fc was replaced"):
        inv(batch)


def test_modes_are_shared_both_ways():
    net = _tiny()
    inv = vispos.make_padding_invariant(net)
    assert not inv.training and not net.training
    inv.train()  # was: net.training stayed False while its children trained
    assert net.training and all(m.training for m in net.modules())
    net.eval()  # was: the wrapper kept reporting its own flag
    assert not inv.training
    net.train()
    assert inv.training
    item = _item()
    x = padded_batch(item, (9, 5))
    buffers = [b.clone() for b in net.buffers()]
    with torch.no_grad():
        got = inv(x)
        for b, saved in zip(net.buffers(), buffers):
            b.copy_(saved)
        net.eval()
        evaluated = inv(x)
    assert not torch.allclose(got, evaluated)  # the training graph ran: batch statistics


class _DropsInTraining(nn.Module):
    """A block whose traced code branches on its own mode (inlined: no rule for it)."""

    def forward(self, x):
        return x * 0.5 if self.training else x


class _WithBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.block, self.bn = nn.Conv2d(3, 4, 3, padding=1), _DropsInTraining(), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.block(self.conv(x)))


def test_a_mode_dependent_module_in_another_mode_is_refused_and_a_frozen_norm_runs():
    torch.manual_seed(0)
    net = trained_like(_WithBlock()).double().eval()
    inv = vispos.make_padding_invariant(net)
    item = _item()
    batch = padded_batch(item, (9, 5))
    net.block.train()  # its code in the eval graph is its eval branch
    with pytest.raises(RuntimeError, match=r"block \(_DropsInTraining\) is in training mode while the model runs in "
                                           r"eval mode.*branches on self\.training"):
        inv(batch)
    net.train()
    net.bn.eval()  # a frozen norm (a layer the graph calls): it follows its own mode
    with torch.no_grad():
        assert_item_alone(net(item[None]), inv(batch))


class _Optional(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, skip=None, scale: float = 1.0):
        y = self.conv(x) * scale
        if skip is not None:
            y = y + skip
        return y


def test_an_optional_forward_argument_is_traced_at_its_default():
    """``forward(x, y=None)`` was refused as a trace that drops code."""
    torch.manual_seed(0)
    net = _Optional().double()
    inv = vispos.make_padding_invariant(net)
    item = _item()
    with torch.no_grad():
        assert_item_alone(net(item[None]), inv(padded_batch(item, (9, 5))))


def test_per_call_check_follows_copies():
    """A deep copy checks its own modules (a hook on the copy is refused, the original runs)."""
    import copy

    net = _chain()
    inv = vispos.make_padding_invariant(net)
    twin = copy.deepcopy(inv)
    batch = padded_batch(_item(), (9, 5))
    handle = twin.get_submodule("2").register_forward_pre_hook(lambda m, a: None)
    with pytest.raises(RuntimeError, match=r"removed from 2 \(Conv2d\)"):
        twin(batch)
    assert_close(inv(batch).tensors, inv(batch).tensors)
    handle.remove()


class _Shared(nn.Module):
    """One convolution held by two parents (as MONAI's DynUNet holds its blocks twice)."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.skip = nn.ModuleDict({"conv": self.block[0]})

    def forward(self, x):
        return self.block(x) + self.skip["conv"](x)


def test_a_module_held_by_two_parents_is_no_change():
    torch.manual_seed(0)
    net = _Shared().double()
    inv = vispos.make_padding_invariant(net)
    item = _item()
    with torch.no_grad():
        assert_item_alone(net(item[None]), inv(padded_batch(item, (9, 5))))
    net.skip["conv"] = nn.Conv2d(3, 4, 3, padding=1).double()
    with pytest.raises(RuntimeError, match=r"its submodule skip\.conv was replaced"):
        inv(padded_batch(item, (9, 5)))
