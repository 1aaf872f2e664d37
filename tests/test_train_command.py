"""``vispos train`` (vispos/app/_train_args.py, vispos/app/_train_command.py) and the command's
smaller answers: the 2D and 3D training run from the installed package in any directory, with
every flag of the demos; ``vispos --version``; ``vispos config show NAME``; one line for a
missing ``--resume`` file and for an unknown ``vispos plot`` kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from vispos.app._config_command import config_text
from vispos.app._train_args import parse_train_args
from vispos.app.cli import main
from vispos.app.train._args import build_parser
from vispos.app.train._task_args import FLAGS_2D, FLAGS_3D
from vispos.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _package_only(tmp_path) -> dict:
    """An environment in which only the ``vispos`` package is importable from the checkout (as
    after ``pip install``): ``demos`` and the tests are not."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "vispos").symlink_to(os.path.join(ROOT, "vispos"))
    return {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_train_tiny_runs_from_an_empty_directory_outside_the_clone(tmp_path):
    """``vispos train --tiny`` as the README gives it, from an empty directory with only the package
    importable: one arm, the loss early against late and one line on what a tiny run shows, no
    tables on the screen (they are written), exit 0. Before: training lived in ``demos/`` (``No
    module named 'demos'`` outside the checkout); then ``--tiny`` trained all three arms (118 s
    on 2 cores, not "under a minute") and printed about 60 lines of tables of zero AP."""
    pytest.importorskip("skimage")
    pytest.importorskip("scipy")
    from vispos.app.train.report import TINY_NOTE

    work = tmp_path / "empty"
    work.mkdir()
    env = _package_only(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import demos"], cwd=work, env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'demos'" in probe.stderr
    proc = subprocess.run([sys.executable, "-m", "vispos.app.cli", "train", "--tiny"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = work / "runs" / "train_detr"
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["sine"]  # one arm
    metrics = json.loads((run / "sine" / "seed0" / "metrics.json").read_text())
    assert metrics["task"] == "2d" and metrics["steps"] == list(range(1, 21))
    assert (run / "ablation.md").is_file() and (run / "curves.png").is_file()
    lines = proc.stdout.splitlines()
    assert TINY_NOTE.format(steps=20, metric="AP", compared="arm", full_steps=3000, doc="docs/training.md") in lines
    assert any(line.startswith("[sine] train loss, mean of steps 1-5 -> steps 16-20: ") for line in lines), proc.stdout
    assert "| seed |" not in proc.stdout and "Paired comparison" not in proc.stdout  # no tables on the screen
    assert f"wrote {os.path.join('runs', 'train_detr', 'ablation.md')}" in proc.stdout
    assert len(lines) <= 12, proc.stdout


@pytest.mark.slow
def test_train_saves_and_resumes(tmp_path, capsys, monkeypatch):
    """``vispos train --resume`` continues a run the command saved (the training core's resume)."""
    pytest.importorskip("skimage")
    pytest.importorskip("scipy")
    import torch

    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    tiny = ["train", "--tiny", "--pos", "sine", "--eval-images", "2", "--threads", "1"]
    try:
        assert main([*tiny, "--steps", "2", "--save-every", "2"]) == 0
        ckpt = tmp_path / "runs" / "train_detr" / "sine" / "seed0" / "checkpoint.pt"
        assert main([*tiny, "--steps", "3", "--out", "more", "--resume", str(ckpt)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "at step 2" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "more" / "sine" / "seed0" / "metrics.json").read_text())
    assert metrics["steps"] == [1, 2, 3] and metrics["resumed_at"] == [2]
    # the same --tiny again into the first run's folder: refused before any work, nothing replaced
    # (before: a second tiny run silently replaced metrics.json, ablation.md and curves.png)
    first = tmp_path / "runs" / "train_detr"
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    assert main([*tiny, "--steps", "2", "--save-every", "2"]) == 2
    assert capsys.readouterr().err == (
        f"vispos train: error: argument --out: {os.path.join('runs', 'train_detr', 'sine', 'seed0')}/ (metrics.json, "
        "checkpoint.pt) holds a finished run, never replaced unless asked: give another --out, or --force to replace "
        "it\n")
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before


def test_tiny_is_a_quick_run():
    args = parse_train_args(["--tiny"])
    assert args.steps == 20 and args.eval_every == 10 and args.volume is False and args.pos == ["sine"]
    assert parse_train_args(["--tiny", "--steps", "6"]).steps == 6  # an explicit flag wins


@pytest.mark.parametrize("flags, command", [(FLAGS_2D, []), (FLAGS_3D, ["--volume"])], ids=["2d", "3d"])
def test_vispos_train_takes_every_flag_of_the_demos(flags, command):
    """``vispos train`` (2D) and ``vispos train --volume`` (3D) parse every flag the demos'
    parsers have, with the same defaults."""
    demo = build_parser(flags)
    ours = build_parser(flags, prog="vispos train", command=True)
    demo_flags = {s for a in demo._actions for s in a.option_strings}
    assert demo_flags <= {s for a in ours._actions for s in a.option_strings}
    args = parse_train_args(command)
    assert args.volume is bool(command)
    for action in demo._actions:
        if action.dest != "help":
            want = flags.defaults.get(action.dest, action.default)
            if want is not None:
                assert getattr(args, action.dest) == want, action.dest
    if command:
        assert args.crop == [16, 32] and args.hidden == 48 and parse_train_args([*command, "--tiny"]).crop == [12, 20]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    return err


def test_missing_resume_file_is_one_line(tmp_path, capsys):
    """Before: the message came after 23 lines of usage."""
    missing = tmp_path / "nope.pt"
    assert main(["train", "--pos", "sine", "--resume", str(missing)]) == 2
    assert f"vispos train: error: argument --resume: no such checkpoint file: '{missing}'" in _one_line(capsys)
    from vispos.app.train import task2d

    with pytest.raises(SystemExit) as info:  # python -m demos.train_detr: the core's check
        task2d.main(["--tiny", "--pos", "sine", "--resume", str(missing)])
    assert info.value.code == 2
    assert "error: argument --resume: no such checkpoint file" in _one_line(capsys)


def test_unknown_plot_kind_is_one_line(capsys):
    """Before: a 12-line usage dump."""
    assert main(["plot", "histogram"]) == 2
    err = _one_line(capsys)
    assert "vispos plot: error: unknown plot kind 'histogram'; (expected one of channels, curves" in err


def test_version(capsys):
    import vispos

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    # the version and the package that runs (a second clone can take over the environment)
    assert capsys.readouterr().out.strip() == f"vispos {vispos.__version__} from {os.path.dirname(vispos.__file__)}"


def test_config_show_prints_the_resolved_yaml(tmp_path, capsys):
    assert main(["config", "show", "detr_resnet18"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# detr_resnet18: ") and "# The smallest shipped config" in out
    assert yaml.safe_load(out) == load_config("detr_resnet18")
    mine = tmp_path / "mine.yaml"  # aliases are expanded
    mine.write_text("type: PositionEmbeddingSine\nnum_pos_feats: &n 16\ntemperature: *n\n")
    assert yaml.safe_load(config_text(str(mine))) == {"type": "PositionEmbeddingSine", "num_pos_feats": 16,
                                                      "temperature": 16}
    assert main(["config", "show", "no_such_config"]) == 2
    assert "is not a config vispos ships; it ships" in _one_line(capsys)


def test_tiny_config_builds_a_small_timm_backbone():
    import vispos

    model = vispos.build_from_config("detr_resnet18")
    assert type(model.backbone).__name__ == "TimmBackbone" and model.hidden_dim == 64
    assert sum(p.numel() for p in model.parameters()) < 12_000_000  # ResNet-18's 11.2 M; a ResNet-50 has 23.5 M


@pytest.mark.parametrize("argv, message", [
    (["train", "--steps", "-1"], "vispos train: error: argument --steps: must be >= 1, got -1"),
    (["train", "--no-such-flag"],
     "vispos train: error: unrecognized arguments: --no-such-flag; see `vispos train --help`"),
    (["run", "--images", "a.png", "--queries", "x"], "vispos run: error: argument --queries: invalid int value: 'x'"),
    (["plot"], "vispos plot: error: the following arguments are required: KIND; see `vispos plot --help`"),
])
def test_usage_errors_are_one_line_in_every_subcommand(tmp_path, argv, message):
    """Before: a bad ``train`` flag printed a 27-line usage block before its one-line error (and
    every other subcommand its own usage block)."""
    proc = subprocess.run([sys.executable, "-m", "vispos.app.cli", *argv], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message + "\n")
