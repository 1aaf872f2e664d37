"""vispos.invariance.rules: the open rule book. A user's layer is refused until a rule is
registered for it; a registered rule (cell-wise, padding-aware, refusal) is what the rewrite uses."""

import copy
import pickle

import pytest
import torch
from torch import nn

import vispos
from vispos.invariance import rules

from item_alone import Invariant, alone_and_in_batch


class ChannelCentre(nn.Module):
    """Subtracts each cell's mean over channels of the Gaussian CDF of its values: cell-wise, but
    ``torch.special.ndtr`` has no row in the function table, so it is refused until declared
    cell-wise."""

    def forward(self, x):
        return x - torch.special.ndtr(x).mean(1, keepdim=True)


class ItemCentre(nn.Module):
    """Subtracts the map's spatial mean: exact only with each item's own mean."""

    def forward(self, x):
        return x - x.mean((2, 3), keepdim=True)


def item_centre(module: nn.Module, x: torch.Tensor, padding):
    """ItemCentre with each item's mean over its valid cells (the Padding's mask, True = padding)."""
    if padding is None:
        return module(x)
    valid = (~padding.mask).unsqueeze(1).to(x.dtype)
    mean = (x * valid).sum((2, 3), keepdim=True) / valid.sum((2, 3), keepdim=True).clamp(min=1)
    return x - mean


class Net(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        self.c1, self.layer, self.c2 = nn.Conv2d(3, 4, 3, padding=1), layer, nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(self.layer(self.c1(x)))


def test_unknown_layer_refused_until_declared_cell_wise(registry):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"ndtr in layer .*no rule for this function on a feature map"):
        Invariant(Net(ChannelCentre()))
    vispos.register_invariance_rule(ChannelCentre, vispos.CellWise())
    bb = Invariant(Net(ChannelCentre())).double().eval()
    assert any(n.op == "call_module" and n.target == "layer" for n in bb.body.graph.nodes)  # kept whole
    alone, got = alone_and_in_batch(bb)
    torch.testing.assert_close(got, alone, rtol=1e-12, atol=1e-12)


def test_padding_aware_rule_gets_each_maps_padding(registry):
    torch.manual_seed(0)
    stock = Invariant(Net(ItemCentre())).double().eval()  # traced through: x.mean over space, exact
    vispos.register_invariance_rule(ItemCentre, vispos.PaddingAware(item_centre))
    bb = Invariant(Net(ItemCentre())).double().eval()
    bb.load_state_dict(stock.state_dict())
    alone, got = alone_and_in_batch(bb)
    torch.testing.assert_close(got, alone, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, alone_and_in_batch(stock)[1], rtol=1e-12, atol=1e-12)
    for clone in (copy.deepcopy(bb), pickle.loads(pickle.dumps(bb))):  # the rule is looked up at run time
        torch.testing.assert_close(alone_and_in_batch(clone)[1], got, rtol=0, atol=0)


def test_refuse_rule_names_the_layer_and_reason(registry):
    vispos.register_invariance_rule(ItemCentre, vispos.Refuse("it is not ready"))
    with pytest.raises(ValueError, match=r"cannot run layer \(ItemCentre\) exactly on a padded batch: it is not ready"):
        Invariant(Net(ItemCentre()))


def test_rule_by_dotted_name_and_subclasses_that_keep_forward(registry):
    class Keeps(ChannelCentre):
        pass

    class Overrides(ChannelCentre):
        def forward(self, x):
            return x

    vispos.register_invariance_rule(f"{ChannelCentre.__module__}.{ChannelCentre.__qualname__}", vispos.CellWise())
    assert isinstance(rules.rule_for(ChannelCentre()), vispos.CellWise)
    assert isinstance(rules.rule_for(Keeps()), vispos.CellWise)
    assert rules.rule_for(Overrides()) is None
    assert rules.classify_module(Overrides())[0] == "refuse"  # no rule: the tracer opens it


@pytest.mark.parametrize("module_type, rule, match", [
    (int, vispos.CellWise(), "key must be an nn.Module subclass, a function, .* got the class int"),
    ("not a name", vispos.CellWise(), "key must be .* got the str 'not a name'"),
    (3, vispos.CellWise(), "key must be .* got a int"),
    (ChannelCentre, "cellwise", "rule must be an InvarianceRule .* got str"),
    # an instance is no key: it would never match a graph node (the class is what is looked up)
    (nn.Hardtanh(0.5, 2), vispos.CellWise(), r"key must be .* got a Hardtanh \(an instance: register its class"),
    (ChannelCentre(), vispos.Refuse("no"), r"got a ChannelCentre \(an instance"),
])
def test_register_checks_its_arguments(module_type, rule, match):
    with pytest.raises(TypeError, match=match):
        vispos.register_invariance_rule(module_type, rule)


def test_builtin_rules_cover_torch_layers():
    assert rules.rule_for(nn.Conv2d(1, 1, 1)).kind == "conv"
    assert rules.rule_for(nn.BatchNorm2d(1)).kind == "norm"
    assert rules.rule_for(nn.ReLU()).kind == "pointwise"
    assert rules.rule_for(nn.LayerNorm(4)).kind == "channels"  # cell-wise over channels last, else refused
    assert rules.rule_for(ChannelCentre()) is None
