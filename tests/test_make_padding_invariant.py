"""vispos.make_padding_invariant: a whole network (MONAI's 3D U-Nets, a 2D classifier, a network
returning a dict) gives an item of a padded batch what it gives the item alone, in eval and
training mode; its state_dict is the network's; a trace that differs from the eager forward, and
what cannot be exact, is refused by name."""

import copy
import pickle

import pytest
import torch
import torchvision
from torch import nn
from torch.testing import assert_close

import vispos
from vispos import NestedTensor
from vispos.invariance import PaddingInvariant

from padded_batch import assert_item_alone as _assert_item_alone
from padded_batch import assert_training_is_the_item_alone
from padded_batch import padded_batch as _batch
from trained_norms import trained_like as _trained_like

monai_nets = pytest.importorskip("monai.networks.nets")


# name -> (builder, item size, partner's size); sizes are multiples of each network's total stride
NETWORKS = {
    "segresnet": (lambda: monai_nets.SegResNet(3, init_filters=4, in_channels=1, out_channels=2, blocks_down=(1, 1, 1),
                                               blocks_up=(1, 1), norm=("group", {"num_groups": 2})),
                  (8, 16, 12), (12, 8, 16)),
    "unet": (lambda: monai_nets.UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1, norm="batch"),
             (8, 12, 16), (16, 8, 4)),
    "dynunet": (lambda: monai_nets.DynUNet(3, 1, 2, kernel_size=[3, 3, 3], strides=[1, 2, 2],
                                           upsample_kernel_size=[2, 2], filters=[4, 8, 16]),
                (12, 8, 16), (8, 16, 8)),
    "basicunet": (lambda: monai_nets.BasicUNet(3, 1, 2, features=(4, 4, 4, 8, 8, 4)), (16, 32, 16), (32, 16, 16)),
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=5), (64, 96), (96, 64)),
}


def _build(name):
    builder, item, other = NETWORKS[name]
    torch.manual_seed(0)
    net = _trained_like(builder()).double()
    return net, item, other


@pytest.mark.parametrize("name", ["segresnet", "unet", "dynunet", "basicunet", "resnet18"])
def test_item_alone_equals_item_in_padded_batch_eval(name):
    net, item_size, other_size = _build(name)
    net.eval()
    inv = vispos.make_padding_invariant(net)
    item = torch.randn(inv.in_channels, *item_size, dtype=torch.float64)
    with torch.no_grad():
        stock = net(item[None])
        alone = inv(NestedTensor(item[None], None))
        batched = inv(_batch(item, other_size))
    _assert_item_alone(stock, alone)
    _assert_item_alone(stock, batched)
    if name == "resnet18":  # a pooled classifier head: per-item logits, not a map
        assert isinstance(batched, torch.Tensor) and batched.shape == (2, 5)
    else:  # the decoder's output map at the input's stride, its padding the input's
        assert isinstance(batched, NestedTensor) and batched.tensors.shape[2:] == batched.mask.shape[1:]
        assert batched.padding == _batch(item, other_size).padding


@pytest.mark.parametrize("name", ["unet", "resnet18", "segresnet"])
def test_training_outputs_running_statistics_and_gradients(name):
    """Training mode on a padded batch of the item alone: batch statistics over its valid cells,
    the same running statistics and the same parameter gradients as the stock network alone."""
    net, item_size, _ = _build(name)
    assert_training_is_the_item_alone(net, vispos.make_padding_invariant, item_size)


def test_state_dict_is_the_networks_both_ways_and_parameters_are_shared():
    net, _, _ = _build("unet")
    inv = vispos.make_padding_invariant(net)
    assert list(inv.state_dict()) == list(net.state_dict())  # no body. prefix, same order
    for key, value in net.state_dict().items():
        assert inv.state_dict()[key].data_ptr() == value.data_ptr(), key  # shared, not copied
    stock = _build("unet")[0]
    with torch.no_grad():
        for p in stock.parameters():
            p.add_(0.25)
    inv.load_state_dict(stock.state_dict())  # stock -> invariant
    assert_close(net.state_dict(), stock.state_dict(), rtol=0, atol=0)
    fresh = monai_nets.UNet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2), num_res_units=1, norm="batch").double()
    fresh.load_state_dict(inv.state_dict())  # invariant -> stock
    assert_close(fresh.state_dict(), stock.state_dict(), rtol=0, atol=0)
    with torch.no_grad():  # a write into the network's weight is the invariant module's too
        next(net.parameters()).zero_()
    assert not next(inv.parameters()).any()


def test_copies_keep_modes_and_outputs_and_move_with_to():
    net, item_size, other_size = _build("dynunet")
    inv = vispos.make_padding_invariant(net).eval()
    batch = _batch(torch.randn(1, *item_size, dtype=torch.float64), other_size)
    with torch.no_grad():
        want = inv(batch).tensors
        for clone in (copy.deepcopy(inv), pickle.loads(pickle.dumps(inv))):
            assert not clone.training
            assert_close(clone(batch).tensors, want, rtol=0, atol=0)
        single = inv.float()(batch.to(torch.float32)).tensors
    assert single.dtype == torch.float32
    assert_close(single.double(), want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


class _DictNet(nn.Module):
    """Two maps at two strides and a pooled per-item vector, returned in a dict."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.down = nn.Sequential(nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        fine = self.stem(x).relu()
        coarse = self.down(fine)
        return {"fine": fine, "coarse": coarse, "logits": self.head(coarse.mean((2, 3))), "pair": (fine, coarse)}


def test_dict_output_keeps_its_structure():
    net = _trained_like(_DictNet()).double().eval()
    inv = vispos.make_padding_invariant(net)
    assert inv.probe_size == (4, 4)
    item = torch.randn(3, 10, 14, dtype=torch.float64)
    with torch.no_grad():
        stock, batched = net(item[None]), inv(_batch(item, (16, 6)))
    assert set(batched) == {"fine", "coarse", "logits", "pair"} and isinstance(batched["pair"], tuple)
    assert isinstance(batched["coarse"], NestedTensor) and batched["coarse"].tensors.shape[2:] == (16, 16)
    assert batched["coarse"].padding.sizes == ((5, 7), (8, 3))  # convolution arithmetic per item
    assert isinstance(batched["logits"], torch.Tensor) and batched["logits"].shape == (2, 2)
    _assert_item_alone(stock, batched)


class _Branchy(nn.Module):
    """Branches on the type of an intermediate value, as MONAI's UpCat does."""

    def __init__(self, jit: bool):
        super().__init__()
        self.jit = jit
        self.conv = nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        check = torch.jit.isinstance if self.jit else isinstance
        if check(y, torch.Tensor):  # plain isinstance: False for a traced value, the branch dropped
            y = y * 2.0 + 1.0
        return y


def test_trace_that_differs_from_the_eager_forward_is_refused():
    with pytest.raises(ValueError, match=r"cannot use the torch\.fx trace of _Branchy.*output 0 differs from the "
                                         r"eager forward.*torch\.jit\.isinstance.*never run"):
        vispos.make_padding_invariant(_Branchy(jit=False))
    # torch.jit.isinstance is answered for the traced value as for the tensor: the branch is kept
    net = _Branchy(jit=True).double()
    inv = vispos.make_padding_invariant(net)
    item = torch.randn(1, 5, 7, dtype=torch.float64)
    _assert_item_alone(net(item[None]), inv(_batch(item, (3, 9))))


def test_basic_unet_items_off_its_stride_are_refused_when_run():
    """BasicUNet's decoder pads a map one cell where an odd size was halved: traced for sizes
    divisible by its stride (16), other sizes are refused, never run inexactly."""
    net, _, _ = _build("basicunet")
    inv = vispos.make_padding_invariant(net)
    assert all(m.is_pad for m in net.modules() if type(m).__name__ == "UpCat")  # restored after tracing
    with pytest.raises(ValueError, match="cover different cells"):
        inv(_batch(torch.randn(1, 16, 16, 24, dtype=torch.float64), (16, 16, 16)))


class _Flattens(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x):
        return self.conv(x).flatten(1)


def test_layers_that_cannot_be_exact_are_refused_by_name():
    with pytest.raises(ValueError, match=r"flatten.*it flattens the spatial axes"):
        vispos.make_padding_invariant(_Flattens(), probe_size=8)


@pytest.mark.parametrize("call, error, match", [
    (lambda: vispos.make_padding_invariant("resnet18"), TypeError, "model must be an nn.Module, got str"),
    (lambda: vispos.make_padding_invariant(nn.ReLU()), ValueError, "num_axes=None reads the spatial axes"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), num_axes="2"), TypeError,
     r"num_axes must be an int, got '2' \(str\)"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), num_axes=4), ValueError, "num_axes must be 2 or 3, got 4"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), probe_size=(8, 8, 8)), ValueError,
     r"probe_size must hold 2 positive sizes.*\(8, 8, 8\)"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), probe_size=8.0), TypeError,
     "probe_size must be an int or a sequence of 2 ints, got 8.0"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), return_nodes=3), TypeError,
     "return_nodes must be a list.*got int"),
    (lambda: vispos.make_padding_invariant(torchvision.models.resnet18(), return_nodes=["layer9"]), ValueError,
     r"return_nodes \['layer9'\] are not all nodes of ResNet"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 7), probe_size=3), ValueError,
     "cannot run on a probe input of size"),
    # a bare IndexError from the probe before
    (lambda: vispos.make_padding_invariant(torchvision.models.resnet18(), num_axes=3), ValueError,
     r"num_axes=3, but the convolutions of ResNet have 2 spatial axes \(the first: conv1, Conv2d\); pass num_axes=2"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), in_channels=0), ValueError,
     "in_channels must be a positive int, got 0"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), in_channels="1"), TypeError,
     r"in_channels must be a positive int or None, got '1' \(str\)"),
    (lambda: vispos.make_padding_invariant(nn.Conv2d(1, 1, 1), rules=[]), TypeError,
     "rules must be a vispos.invariance.RuleBook or None, got list"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_inputs_at_forward():
    inv = vispos.make_padding_invariant(nn.Conv2d(3, 4, 3, padding=1))
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(TypeError, match="x must be a NestedTensor or a Tensor.*got list"):
        inv([x])
    with pytest.raises(TypeError, match="pass mask only with a plain tensor"):
        inv(NestedTensor(x, None), torch.zeros(2, 8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"x must have shape \(B, 3, H, W\), got \(2, 1, 8, 8\)"):
        inv(torch.randn(2, 1, 8, 8))
    with pytest.raises(TypeError, match="mask"):
        inv(x, torch.zeros(2, 8, 8))
    arbitrary = torch.zeros(2, 8, 8, dtype=torch.bool)
    arbitrary[0, 2, 3] = True
    with pytest.raises(ValueError, match="needs each item's box"):
        inv(x, arbitrary)


def test_return_nodes_cut_the_graph_and_public_names():
    net = torchvision.models.resnet18().double().eval()
    inv = vispos.make_padding_invariant(net, return_nodes={"layer2": "c3", "layer4": "c5"})
    out = inv(NestedTensor(torch.randn(1, 3, 64, 64, dtype=torch.float64), None))
    assert list(out) == ["c3", "c5"] and out["c5"].tensors.shape == (1, 512, 2, 2)
    assert vispos.make_padding_invariant is vispos.invariance.make_padding_invariant
    assert "make_padding_invariant" in vispos.__all__ and isinstance(inv, PaddingInvariant)
    assert "network=ResNet, num_axes=2, probe_size=(64, 64)" in repr(inv)


class _Constant(nn.Module):
    """A tensor made in forward: torch.fx stores it as an attribute ``_tensor_constant*`` of the
    module it traces."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x) * torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1).to(x)


def test_the_callers_model_is_not_modified_by_tracing():
    net = _Constant().double()
    attributes, modes = dict(vars(net)), [m.training for m in net.modules()]
    inv = vispos.make_padding_invariant(net)
    assert vars(net).keys() == attributes.keys()  # no _tensor_constant* left on the caller's model
    assert [m.training for m in net.modules()] == modes
    item = torch.randn(1, 5, 7, dtype=torch.float64)
    _assert_item_alone(net(item[None]), inv(_batch(item, (3, 9))))
    for clone in (copy.deepcopy(inv), pickle.loads(pickle.dumps(inv))):
        _assert_item_alone(net(item[None]), clone(_batch(item, (3, 9))))
    assert list(inv.state_dict()) == list(net.state_dict())
    single = inv.float()  # the constants move with the module that holds them
    assert_close(single(_batch(item.float(), (3, 9))).tensors[:1, :, :5, :7], net.float()(item[None].float()))


class _SlowTrace(_Branchy):
    """_Branchy whose forward waits while torch.fx traces it, so two traces overlap."""

    def forward(self, x):
        import time

        time.sleep(0.05)
        return super().forward(x)


def test_concurrent_calls_restore_torch_jit_isinstance():
    """torch.jit.isinstance is patched while tracing: calls from several threads take turns, so the
    last one to finish does not put back another call's patch."""
    import threading

    real, errors = torch.jit.isinstance, []

    def build():
        try:
            vispos.make_padding_invariant(_SlowTrace(jit=True).double())
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and torch.jit.isinstance is real


class _TrainingBranch(nn.Module):
    """Branches on the type of a value in training mode only: the eval graph is the model's, the
    training graph drops the branch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = self.drop(self.bn(self.conv(x)))
        if self.training and isinstance(y, torch.Tensor):
            y = y * 2.0 + 1.0
        return y


def test_training_graph_that_differs_from_the_eager_forward_is_refused():
    net = _TrainingBranch().double()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ValueError, match=r"cannot use the torch\.fx trace of _TrainingBranch.*\(training mode\) output 0 "
                                         r"differs from the eager forward"):
        vispos.make_padding_invariant(net)
    # the check runs the network in training mode on the probe (dropout drawn alike on both
    # sides) and leaves its running statistics as they were
    assert_close(net.state_dict(), state, rtol=0, atol=0)
    seq = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.Dropout(0.5)).double()
    state = {k: v.clone() for k, v in seq.state_dict().items()}
    vispos.make_padding_invariant(seq)
    assert_close(seq.state_dict(), state, rtol=0, atol=0)


class _MixesItems(nn.Module):
    """A pooled head followed by an operation across the batch: not each item's own value."""

    def __init__(self, mix):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.mix = mix

    def forward(self, x):
        return self.mix(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("mix", [lambda v: v.softmax(0), lambda v: v - v.mean(0), lambda v: v.mean(0, keepdim=True),
                                 lambda v: v.flip(0)], ids=["softmax0", "centred", "mean0", "flip0"])
def test_values_that_mix_the_items_of_the_batch_are_refused(mix):
    with pytest.raises(ValueError, match=r"cannot make _MixesItems exact.*two probe items.*output 0"):
        vispos.make_padding_invariant(_MixesItems(mix).double())


def test_an_output_that_does_not_depend_on_the_input_is_returned_as_it_is():
    class WithConstant(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)
            self.anchors = nn.Parameter(torch.randn(1, 4), requires_grad=False)

        def forward(self, x):
            return self.conv(x), self.anchors * 2.0

    net = WithConstant().double()
    maps, anchors = vispos.make_padding_invariant(net)(_batch(torch.randn(1, 5, 7, dtype=torch.float64), (3, 9)))
    assert isinstance(maps, NestedTensor) and anchors.shape == (1, 4)
    assert_close(anchors, net.anchors * 2.0)


class _HeadFirst(nn.Module):
    """A head declared before the stem: the first convolution in modules() order takes 16 channels."""

    def __init__(self):
        super().__init__()
        self.head = nn.Conv2d(16, 2, 1)
        self.stem = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x):
        return self.head(self.stem(x).relu())


def test_input_channels_come_from_the_graph_or_the_caller():
    """The channels were read from the first convolution in declaration order (refused: "cannot run
    on a probe input"), with no argument to fix it."""
    torch.manual_seed(0)
    net = _HeadFirst().double()
    inv = vispos.make_padding_invariant(net)
    assert inv.in_channels == 3
    item = torch.randn(3, 5, 7, dtype=torch.float64)
    with torch.no_grad():
        _assert_item_alone(net(item[None]), inv(_batch(item, (3, 9))))
    assert vispos.make_padding_invariant(net, in_channels=3).in_channels == 3
    with pytest.raises(ValueError, match=r"cannot run on a probe input of size \(\d+, \d+\) with 5 channels.*in_channels"):
        vispos.make_padding_invariant(net, in_channels=5)


class _Reduces(nn.Module):
    def __init__(self, reduce):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.reduce = reduce

    def forward(self, x):
        return self.reduce(self.conv(x))


@pytest.mark.parametrize("reduce, match", [
    (lambda y: y.norm(p=3, dim=(2, 3)), r"norm in .*a norm with p=3 over space"),
    (lambda y: y.flatten(1), r"flatten in .*it flattens the spatial axes"),
    (lambda y: y[:, :, ::2], r"getitem in .*indexing a feature map with .*only channels may be selected"),
], ids=["norm-p3", "flatten", "strided-index"])
def test_a_refusal_names_the_layer_the_reason_and_what_to_do(reduce, match):
    """Every refusal said "Use padding_invariant=False", an argument make_padding_invariant does not have."""
    with pytest.raises(ValueError, match=rf"make_padding_invariant cannot run {match}.*Cut the network before this "
                                         r"layer \(make_padding_invariant\(\.\.\., return_nodes=.*register an exact "
                                         r"rule for it \(vispos\.register_invariance_rule") as info:
        vispos.make_padding_invariant(_Reduces(reduce).double())
    assert "padding_invariant=False" not in str(info.value)


@pytest.mark.parametrize("reduce", [lambda y: y.std((2, 3)), lambda y: y.var((2, 3), keepdim=True),
                                    lambda y: y.amin((2, 3)), lambda y: y.norm(p=1, dim=(2, 3))],
                         ids=["std", "var", "amin", "norm-p1"])
def test_per_item_statistics_once_refused_as_moving_cells_are_exact(reduce):
    """std, var and amin were refused as "reshapes, moves or mixes cells", norm(p=1) as a reduction
    over the wrong dims: each item's own statistics now."""
    torch.manual_seed(0)
    net = _Reduces(reduce).double()
    inv = vispos.make_padding_invariant(net)
    item = torch.randn(3, 5, 7, dtype=torch.float64)
    with torch.no_grad():
        _assert_item_alone(net(item[None]), inv(_batch(item, (3, 9))))


def test_a_probe_failure_names_a_norm_without_running_statistics():
    """It blamed "a value computed across the batch's items after a global pool"."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4, track_running_stats=False),
                        nn.Conv2d(4, 2, 3, padding=1)).double()
    with pytest.raises(ValueError, match=r"\(eval mode\).*Likely: norms without running statistics \(1: "
                                         r"track_running_stats=False"):
        vispos.make_padding_invariant(net)


@pytest.mark.slow
def test_a_float32_resnet50_in_training_mode_is_accepted():
    """The probe checks a float32 model on a float64 copy: batch statistics in training mode amplify
    float32 rounding through ResNet-50's 53 batch norms (about 2e-4 relative), which a float32
    comparison took for a leak and refused; the wrapped model itself stays float32."""
    torch.manual_seed(0)
    net = torchvision.models.resnet50(num_classes=4)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5), m.bias.data.uniform_(-0.5, 0.5)
    inv = vispos.make_padding_invariant(net.train())
    assert next(net.parameters()).dtype == torch.float32 and inv.training
    items = [torch.randn(3, 48, 40), torch.randn(3, 64, 64)]
    net.eval()
    out = inv(vispos.nested_tensor_from_tensor_list(items))
    assert_close(out[0], net(items[0][None])[0], rtol=1e-4, atol=1e-4)


def test_a_hook_that_acts_in_training_only_is_still_caught_on_a_float32_model():
    """The float64 copy the probe checks keeps the model's hooks: a leak in training mode is refused."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
    net[1].register_forward_hook(lambda m, a, o: o + 1.0 if m.training else o)
    with pytest.raises(ValueError, match="training mode"):
        vispos.make_padding_invariant(net)


class _StandardisedStem(nn.Module):
    """A weight-standardised stem (timm's ScaledStdConv2d: F.conv2d of a weight computed from the
    parameter and a gain) before a plain convolution with other channels."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 3, 3, 3))
        self.gain = nn.Parameter(torch.ones(6, 1, 1, 1))
        self.body = nn.Conv2d(6, 4, 3, padding=1)

    def forward(self, x):
        w = torch.nn.functional.batch_norm(self.weight.reshape(1, 6, -1), None, None, training=True)
        x = torch.nn.functional.conv2d(x, w.reshape_as(self.weight) * self.gain, padding=1)
        return self.body(x)


def test_in_channels_read_through_a_computed_weight():
    """The channels come from the first convolution the forward runs, also when its weight is computed
    from a parameter (they were read from a later convolution, or not at all: timm's nf_resnet26)."""
    net = _StandardisedStem().double().eval()
    inv = vispos.make_padding_invariant(net)
    assert inv.in_channels == 3
    items = [torch.randn(3, 9, 7, dtype=torch.float64), torch.randn(3, 12, 12, dtype=torch.float64)]
    out = inv(vispos.nested_tensor_from_tensor_list(items))
    assert_close(out.tensors[0, :, :9, :7], net(items[0][None])[0])


def test_a_probe_that_does_not_fit_in_memory_says_to_pass_a_smaller_probe_size(monkeypatch):
    """An allocation refused while the items are probed (s3d's automatic probe asks 18.4 GiB in
    float64) is a ValueError that says what to do, not the allocator's RuntimeError."""
    import vispos.invariance._network as network

    def refuse(*args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 19756849152 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(network, "check_items", refuse)
    with pytest.raises(ValueError, match=r"does not fit in memory .*pass a smaller probe_size"):
        vispos.make_padding_invariant(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1)))
