"""benchmarks/bench_detectors.py measures what it says: its quick mode writes the table, with the
stock model's batch dependence and vispos' (float64: rounding only) and both steps' costs."""

import re

import pytest
import torch

pytest.importorskip("torchvision")
bench = pytest.importorskip("benchmarks.bench_detectors")


@pytest.mark.slow
def test_quick_mode_writes_the_table(tmp_path):
    threads = torch.get_num_threads()
    out = tmp_path / "results_detectors.md"
    assert bench.main(["--quick", "--models", "lraspp_mobilenet_v3_large", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads
    text = out.read_text()
    assert f"torch {torch.__version__}" in text and "load average" in text and "commit " in text
    (row,) = [line for line in text.splitlines() if line.startswith("| lraspp_mobilenet_v3_large |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert re.fullmatch(r"out [0-9.e+-]+", cells[1]) and re.fullmatch(r"out [0-9.e+-]+", cells[2])
    assert float(cells[1].split()[1]) > 1e-3 and float(cells[2].split()[1]) < 1e-12
    for cell in cells[4:]:
        stock, inv, ratio = re.fullmatch(r"([0-9]+) / ([0-9]+) \(([0-9.]+)x\)", cell).groups()
        assert float(stock) > 0 and float(inv) > 0 and float(ratio) > 0


def test_unknown_model_refused():
    with pytest.raises(SystemExit):
        bench.main(["--models", "nope"])
