"""vispos.invariance.RuleBook: the rule book as one object. Every built-in entry (MONAI's
included) is registered when vispos is imported, so a user's rule registered before the first
call is the one that runs; ``make_padding_invariant(..., rules=book)`` takes a book for one call;
the tracer's decisions (what it keeps whole, traces through, traces as another function,
patches) and the division by a map's size are entries of the book."""

import contextlib
import operator
import subprocess
import sys

import pytest
import torch
from torch import nn

import vispos
from vispos.invariance import RuleBook, default_rules

from padded_batch import assert_item_alone, padded_batch

_FIRST_CALL = r"""
import torch
from torch import nn
import vispos

calls = []

def pad(module, x, padding):
    calls.append(1)
    return module(x)

vispos.register_invariance_rule(nn.ConstantPad2d, vispos.PaddingAware(pad))
net = nn.Sequential(nn.ConstantPad2d(0, 0.0), nn.Conv2d(1, 2, 3, padding=1)).double()  # a pad of 0: same cells
vispos.make_padding_invariant(net)
print("padding-aware calls", len(calls))
vispos.register_invariance_rule(nn.ConstantPad2d, vispos.Refuse("not in my models"))
try:
    vispos.make_padding_invariant(net)
except ValueError as exc:
    print("refused:", "not in my models" in str(exc))
"""


def test_a_users_rule_registered_before_the_first_call_is_the_one_that_runs():
    """In a fresh interpreter (the first trace): MONAI's rows were registered on the first trace and
    replaced the user's rule for nn.ConstantPad2d (its function called 0 times, its Refuse ignored)."""
    out = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert int(lines[0].split()[-1]) > 0 and lines[1] == "refused: True"


class _Scale(nn.Module):
    """Cell-wise, through a function the built-in book has no row for."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return torch.special.ndtr(x) * self.gain


class _Centre(nn.Module):
    def forward(self, x):
        return x - x.mean((2, 3), keepdim=True)


def _centre(module, x, padding):
    if padding is None:
        return module(x)
    valid = (~padding.mask).unsqueeze(1).to(x.dtype)
    return x - (x * valid).sum((2, 3), keepdim=True) / valid.sum((2, 3), keepdim=True)


def _item():
    return torch.randn(3, 6, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_a_book_for_one_call():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _Scale(), _Centre(), nn.Conv2d(4, 2, 3, padding=1)).double()
    book = default_rules().copy().register(_Scale, vispos.CellWise()).register(_Centre, vispos.PaddingAware(_centre))
    assert _Scale in book and _Scale not in default_rules() and len(book) == len(default_rules()) + 2
    with pytest.raises(ValueError, match=r"ndtr in 1 .*no rule for this function"):
        vispos.make_padding_invariant(net)  # the global book does not know it
    inv = vispos.make_padding_invariant(net, rules=book)
    with torch.no_grad():
        assert_item_alone(net(_item()[None]), inv(padded_batch(_item(), (9, 5))))
    with pytest.raises(TypeError, match=r"rules must be a vispos.invariance.RuleBook or None, got dict"):
        vispos.make_padding_invariant(net, rules={})


def test_the_book_api():
    book = RuleBook()
    assert len(book) == 0 and book.rule_for(nn.ReLU()) is None
    assert book.register("relu", vispos.CellWise()) is book and book.rule("relu") == vispos.CellWise()
    assert book.rule_for_call("call_method", "relu") == vispos.CellWise() and book.keys() == ["relu"]
    saved = book.copy()
    book.register(torch.Tensor.sigmoid, vispos.Refuse("no"))  # a tensor method: by its name
    assert book.rule("sigmoid") == vispos.Refuse("no") and "sigmoid" not in saved
    book.restore(saved)
    assert book.keys() == ["relu"]
    with pytest.raises(TypeError, match=r"got a ReLU \(an instance: register its class, ReLU\)"):
        book.register(nn.ReLU(), vispos.CellWise())
    with pytest.raises(TypeError, match="trace_through: key must be an nn.Module subclass"):
        book.trace_through(nn.ReLU())
    with pytest.raises(TypeError, match="fn must be callable"):
        book.trace_as(nn.ReLU, None)
    assert "RuleBook(1 rules" in repr(book)


def test_the_tracers_decisions_are_entries_of_the_book():
    from torchvision.ops import FrozenBatchNorm2d, StochasticDepth
    from torchvision.ops.misc import Conv2dNormActivation

    book = default_rules()
    assert book.opens(Conv2dNormActivation(3, 4)) and not book.keeps_whole(Conv2dNormActivation(3, 4))
    assert book.keeps_whole(FrozenBatchNorm2d(4)) and book.keeps_whole(nn.Conv2d(1, 1, 1))
    assert book.substitute_for(StochasticDepth(0.1, "row")) is not None
    assert book.sized_rule("call_function", operator.truediv).kind == "sized"
    assert book.sized_rule("call_method", "div") is book.sized_rule("call_function", torch.div)


class _Block(nn.Module):
    """A container with a rule of its own (kept whole) that a book may trace through instead."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).relu()


def test_policy_entries_change_what_the_tracer_does():
    from vispos.invariance.tracing._trace import PathTracer

    seen = []

    @contextlib.contextmanager
    def patch(module, num_axes):
        seen.append((type(module).__name__, num_axes, torch.as_tensor is _real_as_tensor))
        yield

    _real_as_tensor = torch.as_tensor
    book = default_rules().copy().register(_Block, vispos.Refuse("kept whole"))
    net = nn.Sequential(_Block())
    calls = [n.op for n in PathTracer(2, rules=book).trace(net).nodes if n.op == "call_module"]
    assert calls == ["call_module"]  # the block, kept whole (its rule)
    book.trace_through(_Block).tracing_patch(_Block, patch)
    targets = [n.target for n in PathTracer(2, rules=book).trace(net).nodes if n.op == "call_module"]
    assert targets == ["0.conv"] and seen == [("_Block", 2, True)]  # traced through; MONAI's patches stay off
    book.trace_as(_Block, lambda module, x, num_axes: x * 2.0)
    ops = [n.target for n in PathTracer(2, rules=book).trace(net).nodes if n.op == "call_function"]
    assert ops == [operator.mul]
