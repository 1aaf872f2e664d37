"""demos/detr/compare.py: the stock against padding-invariant report over two folders of runs."""

from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("scipy")

from vispos.app.train.compare import compare_backbones, main  # noqa: E402


def _write(out, arm, seed, batch, alone):
    """A finished run whose last three evaluations hold ``batch`` (at batch 8) and ``alone``."""
    path = out / arm / f"seed{seed}"
    path.mkdir(parents=True)
    evals = {k: [{"step": s, "mean_iou": 0.5, "ap50": v} for s in (1, 2, 3)] for k, v in (("batch8", batch), ("batch1", alone))}
    metrics = {"seed": seed, "arm": arm, "args": {}, "eval_compositions": ["batch8", "batch1"], "eval_by_composition": evals}
    (path / "metrics.json").write_text(json.dumps(metrics))


def test_report_pairs_backbones_compositions_and_arms(tmp_path, capsys):
    stock, inv = tmp_path / "stock", tmp_path / "inv"
    for seed, (b, a) in enumerate([(0.5, 0.3), (0.45, 0.31), (0.52, 0.29)]):
        _write(stock, "sine", seed, b, a)  # the stock model loses 0.2 alone
        _write(inv, "sine", seed, 0.4 + seed / 100, 0.4 + seed / 100)  # the same alone or batched
        _write(inv, "grid", seed, 0.3, 0.3)
    text = compare_backbones(str(stock), str(inv), "ap50")
    assert "| sine | 1 | 0.450 | 0.310 | 0.410 | 0.410 |" in text
    assert "- sine, stock: batch 8 vs alone over seeds [0, 1, 2]: batch 8 - alone = +0.190" in text
    assert "**batch 8 ahead**" in text
    assert "- sine, invariant: batch 8 vs alone over seeds [0, 1, 2]: batch 8 - alone = +0.000" in text
    assert "- sine, batch 1 over seeds [0, 1, 2]: invariant - stock = +0.110" in text
    assert "- invariant, batch 8: sine vs grid over seeds [0, 1, 2]: sine - grid = +0.110" in text
    assert main(["--stock", str(stock), "--invariant", str(inv), "--out", str(tmp_path / "c.md")]) == 0
    assert (tmp_path / "c.md").read_text() == text == capsys.readouterr().out.rstrip("\n") + "\n"


def test_empty_folder_is_refused(tmp_path):
    (tmp_path / "stock").mkdir()
    with pytest.raises(FileNotFoundError, match="no run under"):
        compare_backbones(str(tmp_path / "stock"), str(tmp_path / "stock"), "ap50")



def test_labels_name_the_two_folders(tmp_path):
    """Two position arms of one backbone (``--labels none rope``): the report names them, never
    stock / invariant, and refuses two equal names."""
    for seed in range(3):
        _write(tmp_path / "a", "none", seed, 0.1 + seed / 100, 0.1 + seed / 100)
        _write(tmp_path / "b", "none", seed, 0.3 + seed / 50, 0.3 + seed / 50)
    text = compare_backbones(str(tmp_path / "a"), str(tmp_path / "b"), "ap50", labels=("none", "rope"))
    assert "stock" not in text and "invariant" not in text
    assert "**What rope changes** (rope - none, same seed, same composition):" in text
    assert "- none, batch 1 over seeds [0, 1, 2]: rope - none = +0.210" in text
    with pytest.raises(ValueError, match="labels must be two different names"):
        compare_backbones(str(tmp_path / "a"), str(tmp_path / "b"), "ap50", labels=("x", "x"))
