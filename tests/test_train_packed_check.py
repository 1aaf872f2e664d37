"""The packed-against-invariant check from training checkpoints (vispos/app/train/packed_check.py):
an invariant and a packed checkpoint of a one-step run give the same metric and outputs within
1e-4 in every held-out composition (exit 0); a twin whose weights differ is reported NOT equal
(exit 1); a stock checkpoint and bad flags are refused in one line (exit 2)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("skimage")
pytest.importorskip("scipy")

from vispos.app.train import packed_check, task2d  # noqa: E402
from vispos.app.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from vispos.app.train.packed_check import check_checkpoint, main  # noqa: E402
from one_line import assert_refused_in_one_line  # noqa: E402


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A one-step invariant run with 2 registers, every held-out composition, and its state
    recorded as a packed and as a stock run."""
    out = tmp_path_factory.mktemp("packed")
    task2d.main(["--tiny", "--backbone", "vit", "--vit-registers", "2", "--pos", "sine", "--steps", "1",
                 "--padding-invariant", "--save-every", "1", "--batch-size", "2", "--eval-images", "4",
                 "--eval-batch-sizes", "3", "1", "--eval-beside-largest", "--threads", "1",
                 "--out", str(out / "inv")])
    inv = out / "inv" / "sine" / "seed0" / "checkpoint.pt"
    state = load_checkpoint(inv)
    paths = {"invariant": str(inv)}
    for name, flags in (("packed", {"packed": True, "padding_invariant": False}),
                        ("stock", {"padding_invariant": False})):
        paths[name] = save_checkpoint(out / f"{name}.pt", {**state, "args": {**state["args"], **flags}})
    return out, paths


def test_invariant_and_packed_checkpoints_are_equal_in_every_composition(checkpoints, capsys):
    out, paths = checkpoints
    for name in ("invariant", "packed"):
        check = check_checkpoint(paths[name])
        assert check.mode == name and check.items == 4 and check.metric == "ap50"
        assert [r["composition"] for r in check.rows] == ["batch3", "batch1", "beside_largest"]
        for row in check.rows:
            assert row["invariant"] == row["packed"], row
            assert row["logits"] <= 1e-4 and row["boxes"] <= 1e-4, row
    table = out / "packed.md"
    assert main([paths["invariant"], paths["packed"], "--out", str(table), "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert len([line for line in printed.splitlines() if line.startswith(f"| {paths['invariant']}")]) == 3
    assert "Packed and invariant: equal" in printed and table.read_text() in printed


@pytest.mark.parametrize("factor", [1.5, float("nan")])
def test_a_twin_that_differs_is_reported_not_equal(checkpoints, monkeypatch, capsys, factor):
    """The check can fail: a packed twin whose stem is scaled gives exit 1 and says so, and one
    whose outputs are NaN too (a NaN difference is never within the tolerance)."""
    _, paths = checkpoints
    build = packed_check._packed_twin

    def moved(*args, **kwargs):
        twin = build(*args, **kwargs)
        assert twin.joiner.backbone._packed is not None  # the blocks run packed
        with torch.no_grad():  # the stem: the tiny ViT's blocks start behind a small layer scale
            for weight in twin.joiner.backbone.body.model.patch_embed.parameters():
                weight.mul_(factor)
        return twin

    monkeypatch.setattr(packed_check, "_packed_twin", moved)
    assert main([paths["invariant"], "--threads", "1", "--eval-images", "2"]) == 1
    printed = capsys.readouterr().out
    assert "Packed and invariant: NOT equal" in printed
    if factor != factor:  # NaN outputs: the matcher cannot score them, the metric says so
        assert "| nan | inf | inf |" in printed


@pytest.mark.parametrize("argv, message", [
    (["{stock}"], "argument CHECKPOINT: checkpoint .* is of a stock ViT, whose padded predictions depend on the padding"),
    (["/no/such/checkpoint.pt"], "argument CHECKPOINT:"),
    (["{invariant}", "--metric", "f1"], "argument --metric: invalid choice"),
    (["{invariant}", "--out", "/no/such/folder/a.md"], "argument --out: no such folder"),
    (["{invariant}", "--device", "tpu"], "argument --device: not a torch device"),
    (["{invariant}", "--eval-images", "100000000"], r"argument --eval-images: must be <= 10000"),
])
def test_bad_input_is_refused_in_one_line(checkpoints, capsys, argv, message):
    _, paths = checkpoints
    assert_refused_in_one_line(main, [a.format(**paths) for a in argv], capsys, message)


def test_check_checkpoint_refuses_bad_arguments(checkpoints):
    _, paths = checkpoints
    with pytest.raises(ValueError, match="metric must be one of"):
        check_checkpoint(paths["invariant"], metric="f1")
    # through vispos/_checks.py, worded as every other argument check
    with pytest.raises(ValueError, match="eval_images must be a positive int, got 0"):
        check_checkpoint(paths["invariant"], eval_images=0)
    for bad, shown in ((True, r"True \(bool\)"), (2.0, r"2.0 \(float\)")):
        with pytest.raises(TypeError, match=f"eval_images must be a positive int or None, got {shown}"):
            check_checkpoint(paths["invariant"], eval_images=bad)
