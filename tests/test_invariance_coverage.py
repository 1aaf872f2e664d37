"""benchmarks/invariance_coverage.py classifies what it says: an exact model as exact, a refusal by
its reason, an accepted but inexact model as SILENT (in eval and in training, running statistics
included), a model past its time budget as skipped; its outputs hold the counts. The full sweep
(every architecture, 0 silent) is marked exhaustive."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import vispos

cov = pytest.importorskip("benchmarks.invariance_coverage")
cases = pytest.importorskip("benchmarks._coverage_cases")


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3, padding=1))


def _case(build, name="net"):
    return cases.Case(name, "test", build, sizes=(((9, 11), (14, 8)),), multiple=4)


class _Wrapper(nn.Module):
    """Accepts any model; in the modes of ``leaks_in`` it runs the model on the padded canvas (what
    a silent bug looks like), in the others on each run of equal-sized items' own cells (exact)."""

    def __init__(self, model, leaks_in=()):
        super().__init__()
        self.model, self.in_channels, self.leaks_in = model, 1, leaks_in

    def forward(self, x):
        if ("training" if self.training else "eval") in self.leaks_in:
            return vispos.NestedTensor(self.model(x.tensors), x.mask)
        sizes = [tuple(int(v) for v in s) for s in x.padding.sizes]
        if len(set(sizes)) == 1:  # one size: the items as one unpadded batch (batch statistics alike)
            h, w = sizes[0]
            return self.model(x.tensors[:, :, :h, :w])
        outs = [self.model(x.tensors[b:b + 1, :, :h, :w])[0] for b, (h, w) in enumerate(sizes)]
        return vispos.nested_tensor_from_tensor_list(outs)


def test_quick_run_writes_the_counts(tmp_path):
    """The command as a user runs it: a fresh interpreter (the models' processes fork from it, so
    nothing another test left in this worker's process reaches them)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "invariance_coverage.py"), "--quick", "--json",
                           str(tmp_path / "c.json"), "--markdown", str(tmp_path / "c.md")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "c.json").read_text())
    status = {f"{r['source']}:{r['model']}": r["status"] for r in data["results"]}
    assert status == {"torchvision:resnet18": "exact", "timm:test_vit": "refused", "monai:UNet-2d-no-residual": "exact"}, \
        [(r["model"], r.get("reason"), r.get("message")) for r in data["results"]]
    assert data["summary"]["counts"] == {"exact": 2, "refused": 1, "SILENT": 0, "error": 0, "skipped": 0}
    refused = next(r for r in data["results"] if r["status"] == "refused")
    assert refused["exception"] == "ValueError" and refused["message"] and "\n" not in refused["message"]
    assert data["summary"]["refusals"] == {refused["reason"]: ["test_vit"]}
    exact = [r for r in data["results"] if r["status"] == "exact"]
    assert all(r["eval_rel"] <= cov.TOL and r["train_rel"] <= cov.TOL for r in exact)
    text = (tmp_path / "c.md").read_text()
    assert "| **SILENT** (accepted, inexact) | **0** |" in text and "| exact | 2 |" in text
    assert f"| {refused['reason']} | 1 | test_vit |" in text


def test_exact_model_is_exact():
    result = cov.check(_case(_net))
    assert result["status"] == "exact", result
    assert result["eval_rel"] <= cov.TOL and result["train_rel"] <= cov.TOL


@pytest.mark.parametrize("leaks_in", ["eval", "training"])
def test_accepted_but_inexact_is_silent(monkeypatch, leaks_in):
    """A wrapper that runs the model on the canvas (its padding leaking through the convolutions
    and, in training, into the batch statistics) is caught in the mode it leaks in."""
    monkeypatch.setattr(vispos, "make_padding_invariant", lambda m: _Wrapper(m, leaks_in=(leaks_in,)))
    result = cov.check(_case(_net))
    assert result["status"] == "SILENT" and result["where"].startswith(leaks_in), result
    exact_mode = "train_rel" if leaks_in == "eval" else "eval_rel"
    assert result[exact_mode] <= cov.TOL


def test_leaked_running_statistics_are_silent(monkeypatch):
    """Outputs right, a batch count wrong after the training step: SILENT."""
    def wrap(model):
        def bump(module, args, output):
            if module.training:
                with torch.no_grad():
                    module.num_batches_tracked.add_(1)
        model[1].register_forward_hook(bump)
        return _Wrapper(model)

    monkeypatch.setattr(vispos, "make_padding_invariant", wrap)
    result = cov.check(_case(_net))
    assert result["status"] == "SILENT" and result["where"] == "training, 1.num_batches_tracked", result


def test_leaked_gradients_are_silent(monkeypatch):
    """Outputs and statistics right, a parameter gradient wrong: SILENT."""
    def wrap(model):
        model[0].weight.register_hook(lambda g: g * 1.001)
        return _Wrapper(model)

    monkeypatch.setattr(vispos, "make_padding_invariant", wrap)
    result = cov.check(_case(_net))
    assert result["status"] == "SILENT" and result["where"] == "training, 0.weight.grad", result


def test_training_within_the_stock_models_own_noise_is_exact(monkeypatch):
    """A training difference above the tolerance but within the stock model's own rounding noise
    (the items in the other order) is exact, with a note; above it, SILENT."""
    def wrap(model):
        model[0].weight.register_hook(lambda g: g * (1 + 1e-7))
        return _Wrapper(model)

    monkeypatch.setattr(vispos, "make_padding_invariant", wrap)
    assert cov.check(_case(_net))["status"] == "SILENT"  # a small network's noise is float64 rounding
    monkeypatch.setattr(cov, "stock_noise", lambda *args: 1e-7)
    result = cov.check(_case(_net))
    assert result["status"] == "exact" and "own rounding noise (1.0e-07" in result["note"], result


def test_refusal_records_type_first_line_and_reason():
    class Shift(nn.Module):
        def forward(self, x):
            return x[:, :, 1:]  # spatial indexing

    result = cov.check(_case(lambda: nn.Sequential(nn.Conv2d(1, 2, 3), Shift())))
    assert result["status"] == "refused" and result["exception"] == "ValueError", result
    assert result["reason"] == cov.refusal_reason(result["message"]) and "\n" not in result["message"]


def test_refusal_reasons_group_messages():
    assert cov.refusal_reason("X: Swin windows are laid out on the canvas, not on the item") == \
        "windowed attention on the canvas (Swin)"
    assert cov.refusal_reason("first line of something new\nmore") == "first line of something new"
    assert cov.refusal_reason("cannot run f in g (graph node 'f') exactly on a padded batch: it does a new thing "
                              "(with x). Cut the network") == "it does a new thing"


def test_draws_are_off_and_norms_trained_like():
    import torchvision

    model = cov.no_draws(torchvision.models.efficientnet_b0(num_classes=3))
    ps = [m.p for m in model.modules() if type(m).__name__ in ("Dropout", "StochasticDepth")]
    assert ps and all(p == 0.0 for p in ps)


def test_past_the_time_budget_is_skipped():
    def slow():
        import time

        time.sleep(30)

    result = cov.run_isolated(_case(slow, "slow"), timeout=1.0, memory_gb=0)
    assert result["status"] == "skipped" and "time budget" in result["reason"]


def test_an_allocation_past_the_memory_budget_is_skipped():
    """torch refuses an allocation past the process's address-space budget with a RuntimeError:
    the model is skipped for its size, not counted as vispos' error."""
    exc = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 19730006016 bytes. Error code 12 (Cannot allocate memory)")
    result = cov._fail({"model": "m", "source": "s"}, exc, "wrap")
    assert result["status"] == "skipped"
    assert result["reason"] == "over the memory budget (wrap: 18.4 GiB asked in one tensor)"
    other = cov._fail({"model": "m", "source": "s"}, RuntimeError("boom"), "eval call")
    assert other["status"] == "error" and other["reason"] == "RuntimeError (eval call)"


def test_too_large_is_skipped(monkeypatch):
    monkeypatch.setattr(cov, "MAX_PARAMS", 10)
    result = cov.check(_case(_net))
    assert result["status"] == "skipped" and "too large" in result["reason"]


def test_shards_merge_into_one_report(tmp_path):
    rows = [{"model": "resnet18", "source": "timm", "status": "exact", "eval_rel": 0.0, "train_rel": 0.0},
            {"model": "resnet18", "source": "torchvision", "status": "refused", "when": "wrap",
             "exception": "ValueError",
             "message": "x (Foo) exactly on a padded batch: it flattens the spatial axes of a feature map"}]
    for i, row in enumerate(rows):
        (tmp_path / f"{i}.json").write_text(json.dumps(
            {"header": f"Coverage: 1 architectures ({10 * i + 5} s on 2 cores, one thread). v.", "results": [row]}))
    cov.main(["--from-json", str(tmp_path / "0.json"), str(tmp_path / "1.json"), "--json", str(tmp_path / "m.json")])
    data = json.loads((tmp_path / "m.json").read_text())
    assert [r["source"] for r in data["results"]] == ["torchvision", "timm"]  # the sweep's order
    assert data["summary"]["counts"]["exact"] == 1 and data["summary"]["refusals"] == {
        "spatial axes flattened (tokens, a flatten)": ["resnet18"]}
    assert data["header"] == "Coverage: 2 architectures (15 s on 2 cores, 2 shards of one thread at once). v."


def test_sweep_has_at_least_150_architectures():
    keys = [c.key for c in cases.all_cases()]
    assert len(keys) >= 150 and len(set(keys)) == len(keys)
    assert {c.source for c in cases.all_cases()} == {"torchvision", "timm", "monai"}


@pytest.mark.exhaustive
def test_full_sweep_never_silent(tmp_path):
    cov.main(["--json", str(tmp_path / "c.json")])
    data = json.loads((tmp_path / "c.json").read_text())
    bad = [r for r in data["results"] if r["status"] in ("SILENT", "error")]
    assert len(data["results"]) >= 150
    assert data["summary"]["counts"]["SILENT"] == 0, bad
    assert not bad, bad
