"""vispos.invariance.rules: the one open table, keyed by a module class, a function or a method
name. A user's function is refused by name until a rule is registered for it, then runs exactly
(float64, an item alone equals the same item in a padded batch); nn.Conv2d and F.conv2d share one
rule object; every operation a built-in rule asks of the rewriter is in the RewriteStep protocol."""

import threading

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

import vispos
from vispos.invariance import TokenModelRule, rules
from vispos.invariance.geometry._geometry import Window
from vispos.invariance.rewrite._rewrite import _Rewriter, make_padding_invariant
from vispos.invariance.tracing._trace import trace_dual

from item_alone import Invariant, alone_and_in_batch, two_items


def my_act(x):
    """A user's cell-wise activation, kept one call in the graph by torch.fx.wrap."""
    return x * torch.sigmoid(x) + 0.5 * x.abs()


def box_blur(x, size: int):
    """A user's windowed op: each cell's mean over a size x size window (zeros outside the map)."""
    weight = torch.ones(x.shape[1], 1, size, size, dtype=x.dtype, device=x.device) / size ** 2
    return F.conv2d(x, weight, padding=size // 2, groups=x.shape[1])


torch.fx.wrap("my_act")
torch.fx.wrap("box_blur")


def soft_gate(x):
    """A user's cell-wise function that nobody fx.wrapped."""
    return x * torch.sigmoid(2.0 * x)


class BoxBlurRule(rules.InvarianceRule):
    """box_blur reads a size x size window of zeros around the item: its arguments come bound by
    box_blur's own signature (``size``)."""

    reads_one_map = True

    def apply(self, step, node, args):
        size, pad = args["size"], args["size"] // 2
        n = step.num_axes
        step.window(node, Window((size,) * n, (1,) * n, (pad,) * n, (pad,) * n, (1,) * n, False), "zero")


class ActNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(my_act(self.c1(x)))


class GateNet(ActNet):
    def forward(self, x):
        return self.c2(soft_gate(self.c1(x)))


class BlurNet(ActNet):
    def forward(self, x):
        return self.c2(box_blur(self.c1(x), 3))


@pytest.mark.parametrize("net, function, rule", [(ActNet, my_act, vispos.CellWise()), (BlurNet, box_blur, BoxBlurRule())])
def test_user_function_refused_by_name_until_registered_then_exact(registry, net, function, rule):
    torch.manual_seed(0)
    stock = net().double().eval()
    with pytest.raises(ValueError, match=rf"cannot run {function.__name__} in .*no rule for this function on a "
                                         "feature map"):
        Invariant(stock)
    vispos.register_invariance_rule(function, rule)
    bb = Invariant(stock).eval()
    assert any(n.op == "call_function" and n.target is function for n in bb.body.graph.nodes)  # one call
    alone, got = alone_and_in_batch(bb)
    torch.testing.assert_close(got, alone, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # and the item alone is what the stock network gives it
        torch.testing.assert_close(alone, stock(two_items()[0][None])[0], rtol=1e-12, atol=1e-12)


def test_registered_function_is_kept_whole_without_fx_wrap(registry):
    torch.manual_seed(0)
    stock = GateNet().double().eval()
    calls = [n.target for n in Invariant(stock).body.graph.nodes if n.op == "call_function"]
    assert soft_gate not in calls and torch.sigmoid in calls  # unregistered: traced through
    vispos.register_invariance_rule(soft_gate, vispos.CellWise())
    assert soft_gate in rules.registered_functions() and F.relu not in rules.registered_functions()
    bb = Invariant(stock).eval()
    calls = [n.target for n in bb.body.graph.nodes if n.op == "call_function"]
    assert calls.count(soft_gate) == 1 and torch.sigmoid not in calls  # registered: one call
    alone, got = alone_and_in_batch(bb)
    torch.testing.assert_close(got, alone, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(alone, stock(two_items()[0][None])[0], rtol=1e-12, atol=1e-12)


def test_blur_without_its_window_is_not_exact(registry):
    """The windowed rule is what makes box_blur exact: declared cell-wise, the blur reads the
    padding (7.0) at the item's edge, and the item in the batch differs from the item alone."""
    torch.manual_seed(0)
    vispos.register_invariance_rule(box_blur, vispos.CellWise())
    alone, got = alone_and_in_batch(Invariant(BlurNet()).double().eval())
    leak = float((got - alone).abs().max())
    assert leak > 1e-3, leak  # the padding's 7.0 read at the edge, far above float64 rounding


def test_module_and_function_share_one_rule_object():
    assert rules.rule_for(nn.Conv2d(1, 1, 1)) is rules.rule_for_call("call_function", F.conv2d)
    assert rules.rule_for(nn.MaxPool3d(2)) is rules.rule_for_call("call_function", F.max_pool3d)
    assert rules.rule_for(nn.Upsample(scale_factor=2)) is rules.rule_for_call("call_function", F.interpolate)
    assert rules.rule_for(nn.ReLU()) is rules.rule_for_call("call_method", "relu")
    assert rules.rule_for_call("call_method", "mean") is rules.rule_for_call("call_function", torch.mean)
    assert rules.rule_for_call("call_function", my_act) is None


def test_keys_a_method_by_name_or_as_tensor_attribute(registry):
    vispos.register_invariance_rule("softmax", vispos.Refuse("not today"))
    assert rules.rule_for_call("call_method", "softmax") == vispos.Refuse("not today")
    vispos.register_invariance_rule(torch.Tensor.logit, vispos.CellWise())
    assert rules.rule_for_call("call_method", "logit") == vispos.CellWise()


@pytest.mark.parametrize("key, rule, match", [
    (int, vispos.CellWise(), r"key must be an nn.Module subclass, a function, .* got the class int"),
    ("two words", vispos.CellWise(), r"key must be .* got the str 'two words'"),
    (None, vispos.CellWise(), r"key must be .* got a NoneType"),
    (nn.ReLU(), vispos.CellWise(), r"key must be .* got a ReLU \(an instance: register its class, ReLU\)"),
    (my_act, vispos.PaddingAware(lambda m, x, p: x), r"rule: PaddingAware\(fn\) .* must be an nn.Module subclass"),
    (my_act, "cellwise", r"rule must be an InvarianceRule .* got str"),
])
def test_register_checks_its_arguments(registry, key, rule, match):
    with pytest.raises(TypeError, match=match):
        vispos.register_invariance_rule(key, rule)


def test_old_keyword_still_registers_and_warns(registry):
    with pytest.warns(DeprecationWarning, match=r"module_type=\.\.\.\) is deprecated.*use key="):
        vispos.register_invariance_rule(module_type=ActNet, rule=vispos.CellWise())
    assert rules.rule_for(ActNet()) == vispos.CellWise()


def test_registration_is_thread_safe(registry):
    def own(i):
        return lambda x: x * i

    functions = [own(i) for i in range(64)]
    threads = [threading.Thread(target=vispos.register_invariance_rule, args=(f, vispos.CellWise())) for f in functions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(rules.rule_for_call("call_function", f) == vispos.CellWise() for f in functions)


# ------------------------------------------------------------ the protocol is the whole interface
_PROTOCOL = {n for n in dir(rules.RewriteStep) if not n.startswith("_")} | set(rules.RewriteStep.__annotations__)


class _OnlyTheProtocol:
    """The rewriter as a rule sees it: any attribute outside RewriteStep raises."""

    def __init__(self, step, seen: set):
        self._step, self._seen = step, seen

    def __getattr__(self, name):
        if name not in _PROTOCOL:
            raise AssertionError(f"a built-in rule asked the rewriter for {name!r}, which RewriteStep does not list")
        self._seen.add(name)
        return getattr(self._step, name)


class _Checked(rules.InvarianceRule):
    """A built-in rule whose step is :class:`_OnlyTheProtocol`; its facts are the rule's own."""

    def __init__(self, rule, seen):
        self._rule, self._seen = rule, seen

    def __getattribute__(self, name):
        if name in ("apply", "on_permuted", "_rule", "_seen", "__class__"):
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "_rule"), name)

    def apply(self, step, node, args):
        self._rule.apply(_OnlyTheProtocol(step, self._seen), node, args)

    def on_permuted(self, step, node, args, layout):
        self._rule.on_permuted(_OnlyTheProtocol(step, self._seen), node, args, layout)


class _Everything(nn.Module):
    """One network with a call of every kind of built-in rule (modules, functions, methods)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn, self.gn, self.inorm = nn.BatchNorm2d(8), nn.GroupNorm(2, 8), nn.InstanceNorm2d(8, affine=True)
        self.act, self.drop = nn.ReLU(), nn.Dropout(0.0)
        self.max, self.avg = nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False)
        self.up, self.deconv = nn.Upsample(scale_factor=2, mode="bilinear"), nn.ConvTranspose2d(8, 8, 2, 2)
        self.ln, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.weight = nn.Parameter(torch.randn(8, 8, 3, 3))
        self.register_buffer("mean", torch.zeros(8))
        self.register_buffer("var", torch.ones(8))

    def forward(self, x):
        x = self.drop(self.act(self.bn(self.conv(x))))
        x = self.inorm(self.gn(self.max(x)))
        x = F.relu(F.conv2d(x, self.weight, padding=1)).contiguous()
        x = F.batch_norm(x, self.mean, self.var, training=False)
        x = F.group_norm(F.instance_norm(x), 4)
        a, b = x.chunk(2, dim=1)
        x = torch.cat([a * b.sigmoid(), b], 1)
        x = self.deconv(self.up(self.avg(x)))
        x = F.interpolate(F.avg_pool2d(F.max_pool2d(x, 2), 2), scale_factor=2)
        y = self.fc(self.ln(x.permute(0, 2, 3, 1)))
        y = y - y.mean((1, 2), keepdim=True)
        x = y.permute(0, 3, 1, 2)
        se = x.mean((2, 3), keepdim=True) + x.sum((2, 3), keepdim=True) * 0 + torch.amax(x, (2, 3), True)
        x = x * se.sigmoid() + x.norm(p=2, dim=(2, 3), keepdim=True) + F.adaptive_max_pool2d(x, 1)
        return x[:, :4], self.pool(x)


def test_every_step_operation_a_rule_calls_is_in_the_protocol(registry, monkeypatch):
    seen: set = set()
    for key, rule in list(rules._book._RULES.items()):
        if not isinstance(rule, TokenModelRule):
            rules._book._RULES[key] = _Checked(rule, seen)
    model = _Everything().eval()
    make_padding_invariant(trace_dual(model, 2), 2, per_item=True)
    tv = pytest.importorskip("torchvision")
    resnet = nn.Sequential(*list(tv.models.resnet18().children())[:-2]).eval()
    make_padding_invariant(trace_dual(resnet, 2), 2)
    make_padding_invariant(trace_dual(tv.models.convnext_tiny().features.eval(), 2), 2)
    assert {"cell_wise", "window", "avg_pool", "global_pool", "with_padding", "norm", "permute", "split",
            "getitem", "num_axes"} <= seen, seen
    assert seen <= _PROTOCOL
    for name in _PROTOCOL - {"num_axes"}:
        assert callable(getattr(_Rewriter, name)), name


# -------------------------------------------------------------------------- the repeat rule
class RepeatNet(ActNet):
    """A conv, ``repeat`` (the call under test), a conv: ``repeat`` is the lambda ``how``."""

    def __init__(self, how, channels_out=8):
        super().__init__()
        self.how, self.c2 = how, nn.Conv2d(channels_out, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(self.how(self.c1(x)))


def _back(x):
    return x.permute(0, 3, 1, 2)


@pytest.mark.parametrize("how", [
    lambda x: x.repeat(1, 2, 1, 1),  # MONAI's VNet: the input copied over more channels
    lambda x: x.repeat([1, 2, 1, 1]),
    lambda x: x.repeat(repeats=(1, 2, 1, 1)),
    lambda x: _back(x.permute(0, 2, 3, 1).repeat(1, 1, 1, 2)),  # channels last: the last axis
], ids=["sizes", "list", "keyword", "permuted"])
def test_channel_only_repeat_is_exact(how):
    torch.manual_seed(0)
    stock = RepeatNet(how).double().eval()
    bb = Invariant(stock).eval()
    assert any(n.op == "call_method" and n.target == "repeat" for n in bb.body.graph.nodes)
    alone, got = alone_and_in_batch(bb)
    torch.testing.assert_close(got, alone, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(alone, stock(two_items()[0][None])[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("how, channels_out, why", [
    (lambda x: x.repeat(2, 1, 1, 1), 4, r"repeats \(2, 1, 1, 1\) copy the map along axis 0 \(the batch\) \(only"),
    (lambda x: x.repeat(1, 1, 2, 1), 4, r"repeats \(1, 1, 2, 1\) copy the map along axis 2 \(spatial\) \(only"),
    (lambda x: x.repeat([1, 2, 1, 3]), 8, r"repeats \(1, 2, 1, 3\) copy the map along axis 3 \(spatial\) \(only"),
    (lambda x: x.repeat(1, 1, 1, 1, 1)[0], 4, r"repeats \(1, 1, 1, 1, 1\) have 5 entries for a feature map of 4"),
    (lambda x: _back(x.permute(0, 2, 3, 1).repeat(1, 2, 1, 1)), 4,
     r"repeats \(1, 2, 1, 1\) copy the map along axis 1 \(spatial\)"),
    (lambda x: x.repeat(1, x.size(1) // 2, 1, 1), 8, r"its repeats .* are not constant ints in the traced graph"),
    (lambda x: x.repeat(repeats=x.new_ones(4, dtype=torch.long).tolist()), 4,
     r"its repeats tolist are not constant ints in the traced graph"),
], ids=["batch", "spatial", "channels-and-spatial", "new-axis", "permuted-spatial", "not-constant", "not-constant-kw"])
def test_repeat_off_the_channels_is_refused_by_name(how, channels_out, why):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=rf"cannot run repeat in .*graph node 'repeat(_\d+)?'.*: {why}"):
        Invariant(RepeatNet(how, channels_out).double())
