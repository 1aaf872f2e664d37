"""benchmarks/gpu_check.py keeps working without a GPU: the command writes its one table with the
CUDA rows skipped, and the cases behind those rows (every encoder family, the invariant backbones)
run on the CPU, where the comparison of a device with itself must be exact."""

import pytest
import torch

gpu_check = pytest.importorskip("benchmarks.gpu_check")


def test_command_writes_one_table_with_cuda_rows_skipped(tmp_path):
    out = tmp_path / "results_gpu.md"
    assert gpu_check.main(["--device", "cpu", "--quick", "--repeats", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# vispos GPU check: CPU only")
    assert f"torch {torch.__version__}" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| section")]
    sections = {row.split(" | ")[0][2:] for row in rows}
    assert sections == {"CUDA = CPU", "padding invariance", "no host sync", "CUDA graph", "timing", "torch.compile",
                        "host overhead", "invariance cost", "invariance cost, compiled", "invariance cost, CUDA graph",
                        "detectors"}
    assert all(gpu_check.NO_CUDA in r for r in rows if r.startswith(("| invariance cost", "| detectors")))
    host = [r for r in rows if r.startswith("| host overhead |")]
    import host_overhead

    assert [r.split(" | ")[1] for r in host] == list(host_overhead.KEYS)
    assert all(" | measured | " in r for r in host)
    for name in gpu_check.FAMILIES:
        assert f"| CUDA = CPU | {name} | {gpu_check.NO_CUDA} |" in text
        assert f"| no host sync | {name} | {gpu_check.NO_CUDA} |" in text
    timed = [row for row in rows if row.startswith("| timing |") and "measured" in row]
    assert {r.split(": ")[0] for r in timed} == {"| timing | DETR C5", "| timing | Deformable-DETR", "| timing | 3D volumes"}
    assert any("transformers DETR" in r for r in timed)
    assert "skipped (--quick on CPU)" in text  # ResNet-50
    assert not any(" | error | " in r or " | FAIL | " in r or " | timeout | " in r for r in rows)


def test_cases_run_on_cpu():
    table = gpu_check.Table(None, [], None)
    gpu_check.families_equal(table, torch.device("cpu"), small=True)
    gpu_check.backbones_equal(table, torch.device("cpu"), small=True)
    assert len(table.rows) == len(gpu_check.FAMILIES) + 2 * len(gpu_check.BACKBONES)
    for section, case, result, value, _ in table.rows:
        assert result == "pass", (case, value)


def test_compare_and_section_budget():
    ok, value = gpu_check.compare([torch.zeros(3)], [torch.full((3,), 1e-3)], atol=1e-4)
    assert not ok and value == "max abs diff 1.00e-03"
    assert not gpu_check.compare(torch.zeros(3), torch.zeros(4), atol=1.0)[0]
    with pytest.raises(gpu_check.SectionTimeout):
        with gpu_check.time_limit(0.05):
            while True:
                pass


def test_invariance_cost_rows_run(monkeypatch):
    """The invariance-cost rows' code runs (on the CPU, small items, one row per precision): a
    ratio of the invariant to the stock step is measured."""
    import benchmarks._gpu_invariance as rows

    monkeypatch.setattr(rows, "EAGER", (("resnet50", ("eval",)),))
    monkeypatch.setattr(rows, "SIDES", {2: (32, 48), 3: (16, 24)})
    table = gpu_check.Table(None, [], None)
    rows.invariance_rows(table, torch.device("cpu"), small=True, repeats=1)
    assert [r[1] for r in table.rows] == ["resnet50 eval, B = 8, float32", "resnet50 eval, B = 8, bfloat16"]
    for _, _, result, value, _ in table.rows:
        assert result == "measured" and "x (" in value, value
