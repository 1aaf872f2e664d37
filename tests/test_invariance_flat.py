"""The wrapper's graph runs with its module lookups done once (``rewrite._flat``): the same outputs
and gradients as the graph's own code, hooks registered before wrapping still run, a module
replaced after wrapping is still refused, and copies and pickles build their own lookups."""

import copy
import pickle

import pytest
import torch
import torchvision
from torch import nn

import vispos
from trained_norms import trained_like


def _batch():
    g = torch.Generator().manual_seed(0)
    items = [torch.randn(3, 64, 48, generator=g, dtype=torch.float64),
             torch.randn(3, 40, 64, generator=g, dtype=torch.float64)]
    return vispos.nested_tensor_from_tensor_list(items)


def _graphs(wrapper):
    """The flat forwards a wrapper keeps, one per graph: ``(graph, forward, namespace)``."""
    return [v for k, v in wrapper.__dict__["_flat_graphs"].items() if k != "owner"]


def _pair():
    net = trained_like(torchvision.models.resnet18(num_classes=4)).double()
    twin = copy.deepcopy(net)
    return vispos.make_padding_invariant(net), vispos.make_padding_invariant(twin)


@pytest.mark.parametrize("training", [False, True])
def test_flat_code_equals_the_graphs_own_code(training):
    flat, own = _pair()
    flat.train(training), own.train(training)
    own.__dict__["_state"] = None  # the graph's own code (the path for a wrapper not followed)
    own.__dict__["_flat_graphs"] = None
    x = _batch()
    x_flat, x_own = (x.tensors.clone().requires_grad_() for _ in range(2))
    out_flat = flat(vispos.NestedTensor(x_flat, x.mask))
    out_own = own(vispos.NestedTensor(x_own, x.mask))
    torch.testing.assert_close(out_flat, out_own, rtol=0, atol=0)
    out_flat.square().sum().backward()
    out_own.square().sum().backward()
    torch.testing.assert_close(x_flat.grad, x_own.grad, rtol=0, atol=0)
    for (name, p), q in zip(flat.named_parameters(), own.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    for (name, b), c in zip(flat.named_buffers(), own.buffers()):
        torch.testing.assert_close(b, c, rtol=0, atol=0, msg=name)
    assert own.__dict__["_flat_graphs"] is None and len(_graphs(flat)) == 1


def test_hooks_set_before_wrapping_run_and_later_changes_are_refused():
    net = torchvision.models.resnet18(num_classes=4).eval()
    seen = []
    net.layer2[0].conv1.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    inv = vispos.make_padding_invariant(net)
    seen.clear()
    inv(_batch().to(torch.float32))
    assert len(seen) == 1
    net.layer2[0].conv1 = nn.Conv2d(64, 128, 3, 2, 1, bias=False)  # replaced after wrapping
    with pytest.raises(RuntimeError, match="make_padding_invariant wrapped"):
        inv(_batch().to(torch.float32))


def test_copies_and_pickles_build_their_own_lookups():
    inv, _ = _pair()
    inv.eval()
    x = _batch()
    want = inv(x)
    for other in (copy.deepcopy(inv), pickle.loads(pickle.dumps(inv))):
        assert "_flat_graphs" not in other.__dict__
        torch.testing.assert_close(other(x), want, rtol=0, atol=0)
        (entry,) = _graphs(other)
        mine = {id(m) for m in other.modules()}
        assert all(id(v) in mine for k, v in vars(entry[2]).items() if k.startswith("_flat_"))


def test_follow_again_looks_the_modules_up_again():
    net = trained_like(torchvision.models.resnet18(num_classes=4)).double().eval()
    inv = vispos.make_padding_invariant(net)
    x = _batch()
    inv(x)
    net.layer2[0].conv1 = nn.Conv2d(64, 128, 3, 2, 1, bias=False).double()
    with pytest.raises(RuntimeError, match="was replaced"):
        inv(x)
    inv.follow()  # the network as it is now is accepted: the new module runs
    torch.testing.assert_close(inv(vispos.NestedTensor(x.tensors, None)), net(x.tensors), rtol=0, atol=0)


def test_a_replica_with_its_own_children_runs_them():
    """What ``torch.nn.parallel.replicate`` makes: ``__dict__`` copied, each child the device's copy."""
    net = trained_like(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                     nn.Conv2d(8, 4, 3, padding=1))).double().eval()
    inv = vispos.make_padding_invariant(net)
    x = torch.randn(2, 3, 10, 12, dtype=torch.float64)
    inv(x)
    replica = inv._replicate_for_data_parallel()
    replica._modules = {name: copy.deepcopy(child) for name, child in replica._modules.items()}
    with torch.no_grad():
        replica._modules["0"].weight.mul_(2.0)
    want = x
    for name in "0123":
        want = replica._modules[name](want)
    torch.testing.assert_close(replica(x).tensors, want, rtol=0, atol=0)
