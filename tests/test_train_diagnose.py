"""Attention diagnostics of the ViT detector (vispos/app/train/attention.py, diagnose.py and
vispos/app/figures/attention.py): the weights and masses against a hand-computed softmax, and the
command on a checkpoint written by a one-step run of the app (stock, and its weights as the
invariant and the packed ViT): one row per block, masses in [0, 1], the invariant ViT's mass on
padding measured 0, the stock one's above 0, the figure written."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("skimage")
pytest.importorskip("scipy")

from vispos.app.train import task2d  # noqa: E402
from vispos.app.train.attention import (  # noqa: E402
    CLASS, PADDING, PATCH, REGISTER, AttentionProbe, attention_sums, attention_weights, norm_outlier_counts,
)
from vispos.app.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from vispos.app.train.diagnose import COLUMNS, diagnose_checkpoint, main  # noqa: E402
from one_line import assert_refused_in_one_line  # noqa: E402

MASSES = ("padding_mass", "class_mass", "register_mass")


def test_attention_weights_are_the_hand_computed_softmax():
    q = torch.tensor([[[[1.0, 0.0], [0.0, 2.0]]]])  # (1, 1, 2, 2)
    k = torch.tensor([[[[1.0, 1.0], [2.0, 0.0], [0.0, -1.0]]]])  # (1, 1, 3, 2)
    keep = torch.tensor([True, True, False])
    got = attention_weights(q, k, keep, scale=0.5)
    for i, (a, b) in enumerate(((0.5, 1.0), (1.0, 0.0))):  # q . k * 0.5 for the two kept keys
        total = math.exp(a) + math.exp(b)
        want = torch.tensor([math.exp(a) / total, math.exp(b) / total, 0.0], dtype=torch.float64)
        torch.testing.assert_close(got[0, 0, i], want, rtol=1e-12, atol=0)
    additive = torch.tensor([0.0, 0.0, -math.inf]).expand(2, 3)
    torch.testing.assert_close(attention_weights(q, k, additive, scale=0.5), got, rtol=1e-12, atol=0)
    torch.testing.assert_close(attention_weights(q, k), (q @ k.transpose(-2, -1) / math.sqrt(2)).double().softmax(-1))
    with pytest.raises(ValueError, match="q and k must be"):
        attention_weights(q[0], k)


def test_attention_sums_by_hand():
    kinds = torch.tensor([[CLASS, REGISTER, PATCH, PATCH, PADDING]])
    w = torch.zeros(1, 2, 5, 5, dtype=torch.float64)
    w[..., :, 0] = 1.0  # class and register queries and the padding query: not counted (all on the class token)
    w[0, 0, 2] = torch.tensor([0.1, 0.2, 0.3, 0.0, 0.4])
    w[0, 0, 3] = torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0])
    w[0, 1, 2] = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2])
    w[0, 1, 3] = torch.tensor([0.0, 0.5, 0.0, 0.0, 0.5])
    s = attention_sums(w, kinds)
    assert s.queries == 4  # 2 heads x 2 valid patch queries
    m = s.means()
    assert m["padding_mass"] == pytest.approx((0.4 + 0 + 0.2 + 0.5) / 4)
    assert m["class_mass"] == pytest.approx((0.1 + 0 + 0.2 + 0) / 4)
    assert m["register_mass"] == pytest.approx((0.2 + 0 + 0.2 + 0.5) / 4)
    def h(*p):
        return -sum(x * math.log(x) for x in p if x)

    assert m["entropy"] == pytest.approx((h(0.1, 0.2, 0.3, 0.4) + h(0.5, 0.5) + h(*[0.2] * 5) + h(0.5, 0.5)) / 4)
    assert m["padding_share"] == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="weights must be"):
        attention_sums(w, kinds[:, :4])


def test_norm_outliers_by_hand():
    kinds = torch.tensor([[CLASS, PATCH, PATCH, PATCH, PATCH, PADDING]])
    norms = torch.tensor([100.0, 1.0, 1.0, 1.5, 3.0, 50.0])  # median of the valid four: 1.25
    tokens = torch.zeros(1, 6, 2)
    tokens[0, :, 0] = norms
    s = norm_outlier_counts(tokens, kinds, ratio=2.0)
    assert (s.patch_tokens, s.outliers) == (4, 1)  # 3.0 > 2 x 1.25; the class and padding tokens not counted
    assert s.max_norm_ratio == pytest.approx(3.0 / 1.25)
    assert norm_outlier_counts(tokens, kinds, ratio=2.5).outliers == 0
    with pytest.raises(ValueError, match="ratio must be > 0"):
        norm_outlier_counts(tokens, kinds, ratio=0)


def test_the_probe_sees_the_weights_sdpa_applies():
    """The weights the probe recomputes, applied to the values, give SDPA's output."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    keep = torch.tensor([True, True, True, False, True]).expand(2, 1, 1, 5)

    class Block(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).flatten(2)

    probe = AttentionProbe([Block()])
    probe.kinds = torch.tensor([[CLASS, PATCH, PATCH, PADDING, PATCH]] * 2)
    with probe:
        out = probe.blocks[0](q)
    seen = attention_weights(q, k, keep)
    torch.testing.assert_close(out, (seen @ v).transpose(1, 2).flatten(2), rtol=1e-12, atol=1e-12)
    m = probe.sums[0].means()
    assert m["padding_mass"] == 0 and probe.sums[0].queries == 2 * 3 * 3 and probe.sums[0].patch_tokens == 2 * 3


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A one-step stock run of the app with --save-every; its weights as the invariant and the
    packed ViT (the weights of the three are the same modules)."""
    out = tmp_path_factory.mktemp("diag")
    task2d.main(["--tiny", "--backbone", "vit", "--vit-registers", "2", "--pos", "sine", "--steps", "1",
                 "--save-every", "1", "--batch-size", "2", "--eval-images", "3", "--eval-batch-sizes", "3",
                 "--threads", "1", "--out", str(out / "stock")])
    stock = out / "stock" / "sine" / "seed0" / "checkpoint.pt"
    state = load_checkpoint(stock)
    paths = {"stock": str(stock)}
    for name, flags in (("invariant", {"padding_invariant": True}), ("packed", {"packed": True}),
                        ("cnn", {"backbone": "test_resnet"})):
        paths[name] = save_checkpoint(out / f"{name}.pt", {**state, "args": {**state["args"], **flags}})
    return out, paths


def test_diagnostics_of_stock_and_invariant_checkpoints(checkpoints, capsys):
    out, paths = checkpoints
    runs = {name: diagnose_checkpoint(paths[name]) for name in ("stock", "invariant", "packed")}
    for name, run in runs.items():
        assert run.mode == name and run.registers == 2 and run.stats.items == 3
        assert [row["block"] for row in run.stats.blocks] == [0, 1, 2, 3]  # the level is the last block
        for row in run.stats.blocks:
            assert all(0 <= row[k] <= 1 for k in MASSES), row
            assert row["register_mass"] > 0 and row["class_mass"] > 0 and 0 <= row["outlier_fraction"] <= 1
            assert 0 < row["entropy"] < math.log(200)
    assert 0 < runs["stock"].stats.padding_share < 1
    assert all(row["padding_mass"] > 1e-3 for row in runs["stock"].stats.blocks)
    for name in ("invariant", "packed"):
        assert all(row["padding_mass"] <= 1e-6 for row in runs[name].stats.blocks)

    figure, table = out / "attention.png", out / "attention.md"
    assert main([paths["stock"], paths["invariant"], "--figure", str(figure), "--out", str(table),
                 "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 4 and all(len(r.strip("|").split("|")) == 1 + 2 * len(COLUMNS) for r in rows)
    header = next(line for line in printed.splitlines() if line.startswith("| block"))
    assert "mass on padding (stock)" in header and "mass on padding (invariant)" in header
    pad_inv = [float(r.strip("|").split("|")[2]) for r in rows]
    assert all(v <= 1e-6 for v in pad_inv)
    assert figure.stat().st_size > 1000 and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table.read_text() in printed


@pytest.mark.parametrize("argv, message", [
    (["{cnn}"], "argument CHECKPOINT: checkpoint .* with --backbone test_resnet; the diagnostics read"),
    (["{stock}", "--labels", "a", "b"], "argument --labels: one per checkpoint \\(1\\), got 2"),
    (["{stock}", "--figure", "/no/such/folder/a.png"], "argument --figure: no such folder"),
    (["/no/such/checkpoint.pt"], "argument CHECKPOINT:"),
    (["{stock}", "--device", "tpu"], "argument --device: not a torch device"),
    (["{stock}", "--device", "meta"], "argument --device: expected cpu, or cuda"),
])
def test_bad_input_is_refused_in_one_line(checkpoints, capsys, argv, message):
    _, paths = checkpoints
    assert_refused_in_one_line(main, [a.format(**paths) for a in argv], capsys, message)


@pytest.mark.parametrize("damage, message", [
    ("truncated", r"is not a readable checkpoint \(empty, truncated, or not written by torch.save\): RuntimeError: "),
    ("empty", r"is not a readable checkpoint \(empty, truncated, or not written by torch.save\): EOFError$"),
    ("text", r"is not a readable checkpoint \(empty, truncated, or not written by torch.save\): \w+Error"),
    ("folder", r"is not a readable checkpoint: IsADirectoryError: "),
    ("no arm", r"does not record its flags, arm and weights as a training run writes them \(.*arm NoneType"),
    ("args a list", r"does not record its flags, arm and weights .*\(args list"),
    ("foreign weights", r"its weights do not fit the detector its flags rebuild: \d+ missing keys .*1 unexpected key"),
])
def test_a_damaged_checkpoint_is_refused_in_one_line(checkpoints, tmp_path, capsys, damage, message):
    """A damaged file given as CHECKPOINT ends the command with one line naming it (exit 2), not a
    traceback. Before: a text file said only 'not a readable checkpoint: 101', an empty one ended
    in ':', a checkpoint without its arm ended in KeyError 'arm', one whose args were no dict in
    AttributeError, and foreign weights printed every key of the model on one line."""
    _, paths = checkpoints
    data = open(paths["stock"], "rb").read()
    state = load_checkpoint(paths["stock"])
    bad = tmp_path / "bad.pt"
    if damage == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "text":
        bad.write_text("hello\n")
    elif damage == "folder":
        bad.mkdir()
    elif damage == "no arm":
        torch.save({k: v for k, v in state.items() if k != "arm"}, bad)
    elif damage == "args a list":
        torch.save({**state, "args": ["--backbone", "vit"]}, bad)
    else:
        torch.save({**state, "model": {"x": torch.zeros(1)}}, bad)
    line = assert_refused_in_one_line(main, [str(bad), "--threads", "1"], capsys, message)
    assert line.startswith("python -m vispos.app.train.diagnose: error: argument CHECKPOINT: ")
    assert str(bad) in line and len(line) < 600, line


@pytest.mark.parametrize("argv, message", [
    (["--figure", "{folder}"], "argument --figure: '.*' is a folder: give the file to write"),
    (["--out", "{folder}"], "argument --out: '.*' is a folder: give the file to write"),
    (["--eval-images", "100000000"], r"argument --eval-images: must be <= 10000 \(as vispos train's\), got 100000000"),
    (["--batch-size", "1025"], r"argument --batch-size: must be <= 1024 \(as vispos train's\), got 1025"),
])
def test_flags_beyond_their_bounds_are_refused_before_any_work(checkpoints, tmp_path, capsys, argv, message):
    """Before: --figure / --out naming a folder ended in an IsADirectoryError traceback after the
    whole run; --eval-images 100000000 built held-out images for minutes (vispos train bounds it)."""
    _, paths = checkpoints
    argv = [paths["stock"], "--threads", "1"] + [a.format(folder=tmp_path) for a in argv]
    assert_refused_in_one_line(main, argv, capsys, message)


@pytest.mark.parametrize("kwargs", [{"is_causal": True}, {"dropout_p": 0.1}, {"enable_gqa": True}])
def test_attention_recorder_refuses_sdpa_calls_it_cannot_recompute(kwargs):
    """Causal masks, dropout and GQA would make the recomputed softmax differ from what SDPA
    attended: refused by name, never reported."""
    import torch.nn.functional as F

    from vispos.app.train.attention import AttentionProbe

    recorder = AttentionProbe.__new__(AttentionProbe)  # only the SDPA hook is exercised
    recorder._block = 0
    q = torch.ones(1, 1, 3, 4)
    with pytest.raises(ValueError, match="plain SDPA calls"):
        recorder.__torch_function__(F.scaled_dot_product_attention, (), (q, q, q), dict(kwargs))


def test_diagnose_checks_its_arguments_through_the_shared_checks(tmp_path):
    """``eval_images`` and ``batch_size`` are checked (vispos/_checks.py) before the checkpoint is
    read, worded as every other argument check."""
    missing = tmp_path / "none.pt"
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        diagnose_checkpoint(missing, batch_size=0)
    with pytest.raises(TypeError, match=r"eval_images must be a positive int or None, got True \(bool\)"):
        diagnose_checkpoint(missing, eval_images=True)
