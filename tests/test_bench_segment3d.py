"""benchmarks/bench_segment3d.py measures what it says: its quick mode runs end to end (the three
pipelines' training steps, every inference row, the peak-memory processes) and writes its report;
the report's ratios are taken round by round."""

import argparse
import re

import pytest
import torch

bench = pytest.importorskip("benchmarks.bench_segment3d")

NUMBER = r"[0-9]+(?:\.[0-9]+)?"
CELL = rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]"


def _rows(text: str, first: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(f"| {first}")]


def _check_quick_report(tmp_path, *extra: str) -> None:
    threads = torch.get_num_threads()
    out = tmp_path / "results_segment3d.md"
    assert bench.main(["--quick", *extra, "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads  # the benchmark's one thread is not left behind
    text = out.read_text()
    assert f"torch {torch.__version__}" in text and "load average" in text and "commit " in text
    assert f"`python benchmarks/bench_segment3d.py --quick {' '.join(extra)}{' ' if extra else ''}--out " in text
    for name in bench.PIPELINES:
        (row,) = [r for r in _rows(text, name) if len(r) == 4]
        for cell in row[1:]:
            med, q1, q3 = map(float, re.fullmatch(CELL, cell).groups())
            assert 0 < q1 <= med <= q3, (name, cell)
    infer = [r for r in _rows(text, "") if len(r) == 5 and r[0] in bench.PIPELINES]
    assert [(r[0], r[1]) for r in infer] == [
        ("crop", "sliding window, alone"), ("whole", "alone"), ("whole", "padded batches of 4"),
        ("invariant", "alone"), ("invariant", "padded batches of 4")]
    for row in infer:
        assert float(re.fullmatch(CELL, row[2]).group(1)) > 0
        if "--no-peak" in extra:
            assert row[4] == "-"
        else:
            assert int(row[4]) > 0  # one peak-memory pass in --quick, in MiB
    if "--no-peak" not in extra:
        ratios = _rows(text, "whole / crop") + _rows(text, "invariant / whole") + _rows(text, "invariant / crop")
        assert len(ratios) == 3 and all(len(r) == 9 for r in ratios)
    diffs = re.search(rf"whole ({NUMBER}e[-+][0-9]+), invariant ({NUMBER}e[-+][0-9]+)", text)
    assert float(diffs.group(2)) < 1e-4 < float(diffs.group(1))  # exact where it claims to be


@pytest.mark.slow
def test_quick_mode_end_to_end_without_the_peak_processes(tmp_path):
    _check_quick_report(tmp_path, "--no-peak")


@pytest.mark.exhaustive
def test_quick_mode_end_to_end(tmp_path):
    """With the peak-memory processes (one fresh interpreter per pipeline: about 40 s more)."""
    _check_quick_report(tmp_path)


def test_report_ratios_are_paired_by_round():
    """Each ratio is summarised over the rounds' own ratios (load falls on both sides of each),
    not taken between two medians."""
    train = {"crop": {"wall": [1.0, 2.0, 4.0], "cpu": [1.0, 1.0, 1.0], "data": [0.1] * 3},
             "whole": {"wall": [2.0, 4.0, 8.0], "cpu": [3.0, 3.0, 3.0], "data": [0.1] * 3},
             "invariant": {"wall": [3.0, 4.0, 16.0], "cpu": [3.0, 6.0, 3.0], "data": [0.1] * 3},
             "padded_fraction": 0.25}
    per = {"crop": 2.0, "whole": 1.0, "invariant": 1.5}
    inference = {(n, k): {"wall": [per[n] * (1 + (k == "batch4"))] * 2, "cpu": [per[n]] * 2}
                 for n, k in bench.INFER_ROWS}
    inference["logit_diff"] = {"whole": 0.5, "invariant": 1e-6}
    peaks = {row: [2**20 * 10, 2**20 * 5] if row[0] == "crop" else [2**20 * 40, 2**20 * 20]
             for row in bench.INFER_ROWS}
    app = argparse.Namespace(network="segresnet", features=8, batch_size=2, sizes=[32, 64], spacings=[2.0, 4.0],
                             patch=32)
    meta = {"command": "python benchmarks/bench_segment3d.py", "monai": "x", "load_before": (1, 2, 3),
            "load_after": (1, 2, 3), "commit": "abc", "seconds": 1.0, "app": app, "held": 2, "held_voxels": "",
            "steps": 3, "warmup": 0, "rounds": 2, "infer_warmup": 0, "peak_passes": 2}
    text = bench.report(meta, train, inference, peaks)
    (whole_crop,) = _rows(text, "whole / crop")
    (inv_whole,) = _rows(text, "invariant / whole")
    assert whole_crop[1:3] == ["2.00 [2.00, 2.00]", "3.00 [3.00, 3.00]"]  # medians' ratio would be 2.00 too
    assert inv_whole[1] == "1.50 [1.25, 1.75]"  # rounds: 1.5, 1.0, 2.0 (medians' ratio: 4 / 4 = 1.00)
    assert inv_whole[2] == "1.00 [1.00, 1.50]"  # rounds: 1.0, 2.0, 1.0
    assert whole_crop[3:7] == ["0.50 [0.50, 0.50]", "0.50 [0.50, 0.50]", "1.00 [1.00, 1.00]", "0.50 [0.50, 0.50]"]
    assert whole_crop[7:] == ["4.00", "4.00"] and inv_whole[7:] == ["1.00", "1.00"]  # the larger pass
    assert "| crop | sliding window, alone | 2.000 [2.000, 2.000] | 2.000 [2.000, 2.000] | 10 / 5 |" in text
