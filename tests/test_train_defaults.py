"""What ``vispos train`` says against what it does (vispos/app/train/_args.py, _task_args.py,
segment3d_args.py, report.py): every default that the help, the closing hint of ``--tiny`` and
the docs state is the parser's own; each help text names only flags its parser takes; a folder
that holds a finished run is refused before any work, unless ``--force``."""

from __future__ import annotations

import argparse
import json
import os
import re

import pytest

from vispos.app._train_args import parse_train_args
from vispos.app.train._args import build_parser, finished_arms, finished_run, full_defaults
from vispos.app.train._task_args import FLAGS_2D, FLAGS_3D
from vispos.app.train.report import tiny_summary
from vispos.app.train.segment3d_args import SEGMENT_DOC, build_segment_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _doc(name: str) -> str:
    with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as f:
        return " ".join(f.read().split())


def _help(parser) -> str:
    return " ".join(parser.format_help().split())


@pytest.mark.parametrize("flags", [FLAGS_2D, FLAGS_3D], ids=["2d", "3d"])
def test_help_states_the_defaults_the_run_takes(flags):
    """Before: ``--volume --help`` said "evaluate every K steps (default 300)" where the 3D run
    evaluates every 250, and "6000 with --backbone vit" where --volume has no --backbone."""
    command = [] if flags is FLAGS_2D else ["--volume"]
    args = parse_train_args(command)
    full = full_defaults(flags)
    for name in ("steps", "eval_every", "batch_size", "eval_images", "warmup", "lr"):
        assert getattr(args, name) == full[name], name
    text = _help(build_parser(flags, prog="vispos train", command=True))
    assert f"optimiser steps (default {full['steps']}" in text
    assert f"evaluate every K steps (default {full['eval_every']}" in text
    assert f"items per process and step (default {full['batch_size']})" in text
    assert f"AdamW learning rate (default {full['lr']:g}" in text
    assert flags.doc in text
    vit = parse_train_args([*command, "--backbone", "vit"]) if flags is FLAGS_2D else None
    if vit is not None:  # the backbone's own defaults, stated beside the task's
        for name in ("steps", "eval_every", "lr"):
            assert getattr(vit, name) == full_defaults(flags, "vit")[name]
        assert f"{full_defaults(flags, 'vit')['steps']} with --backbone vit" in text


@pytest.mark.parametrize("argv", [[], ["--volume"], ["--volume", "--task", "segment"]], ids=["2d", "3d", "segment"])
def test_help_names_only_flags_it_takes(argv):
    """Every ``--flag`` a help text mentions is one its parser accepts (``--volume --help`` spoke
    of ``--backbone``, which ``--volume`` refuses)."""
    if argv[-1:] == ["segment"]:
        parser = build_segment_parser("vispos train")
    else:
        parser = build_parser(FLAGS_3D if argv else FLAGS_2D, prog="vispos train", command=True)
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100_000)  # no line breaks in a flag
    taken = {s for a in parser._actions for s in a.option_strings}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w])", parser.format_help()))  # not DETR's --pre_norm
    assert named and named <= taken, sorted(named - taken)


def test_docs_state_the_defaults_of_each_task():
    """docs/training3d.md said "every 250 steps" while ``--volume --help`` said 300; each page's
    sentence of defaults is compared with the parser."""
    full3 = full_defaults(FLAGS_3D)
    text = _doc("training3d.md")
    found = re.search(r"Defaults for 3D: (\d+) steps of batch (\d+), evaluation every (\d+) steps on (\d+) held-out "
                      r"crops, AdamW at ([\d.e-]+) with (\d+) warm-up steps", text)
    assert found, "docs/training3d.md: the sentence of defaults is gone"
    assert [int(found[i]) for i in (1, 2, 3, 4, 6)] == [full3[k] for k in ("steps", "batch_size", "eval_every",
                                                                            "eval_images", "warmup")]
    assert float(found[5]) == full3["lr"]
    spacing = re.search(r"`--spacing` mm \(default ([\d.]+),", text)
    assert spacing and float(spacing[1]) == build_parser(FLAGS_3D).get_default("spacing")
    out = re.search(r"\(default `([^`]+)`, relative to where you run it\)", text)
    assert out and out[1] == build_parser(FLAGS_3D).get_default("out")
    full2 = full_defaults(FLAGS_2D)
    found = re.search(r"at the defaults \((\d+) steps of batch (\d+),", _doc("training.md"))
    assert found and (int(found[1]), int(found[2])) == (full2["steps"], full2["batch_size"])
    seg = build_segment_parser()
    found = re.search(r"The default run \((\d+) steps, batch (\d+), `--sizes (\d+) (\d+)`, (\d+) held-out volumes, a "
                      r"held-out Dice every (\d+) steps\)", _doc("segmentation3d.md"))
    assert found and [int(g) for g in found.groups()] == [
        seg.get_default("steps"), seg.get_default("batch_size"), *seg.get_default("sizes"),
        seg.get_default("eval_images"), seg.get_default("eval_every")]


@pytest.mark.parametrize("flags", [FLAGS_2D, FLAGS_3D], ids=["2d", "3d"])
def test_tiny_hint_names_the_tasks_full_run(flags):
    """Before: the 3D tiny run's closing hint said "3000 steps ... docs/training.md"; the 3D
    default is 2000 steps and its page docs/training3d.md."""
    runs = {"sine": {"loss_last": [4.0, 3.0, 2.0, 1.0], "steps": [1, 2, 3, 4]}}
    lines = tiny_summary(runs, full_defaults(flags)["steps"], flags.doc)
    assert lines[0] == "[sine] train loss, mean of step 1 -> step 4: 4.000 -> 1.000 (falling)"
    assert f"train without --tiny ({full_defaults(flags)['steps']} steps, several seeds: {flags.doc})" in lines[-1]
    seg = tiny_summary(runs, build_segment_parser().get_default("steps"), SEGMENT_DOC, "Dice", "pipeline")
    assert "held-out Dice stays near 0" in seg[-1] and "(250 steps, several seeds: docs/segmentation3d.md)" in seg[-1]


def test_metric_legend_says_what_map_averages():
    pytest.importorskip("monai")
    from vispos.app.train.task3d import IOU_RANGE, METRIC_LEGEND, TASK

    assert TASK.metric_legend == METRIC_LEGEND and IOU_RANGE == (0.1, 0.5, 0.05)
    assert "map, AP averaged over IoU 0.10 to 0.50 in steps of 0.05" in METRIC_LEGEND
    assert "ap25 and ap50, AP at IoU 0.25 and 0.50" in METRIC_LEGEND


def _finished(run_dir, *others):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({"steps": [1, 2]}))
    for name in others:
        (run_dir / name).write_text("x")
    return {p.name: p.read_bytes() for p in run_dir.iterdir()}


@pytest.mark.parametrize("argv, run", [
    (["--tiny"], "sine/seed0"),
    (["--tiny", "--volume", "--seed", "3"], "sine/seed3"),
    (["--tiny", "--volume", "--task", "segment"], "invariant/segresnet/seed0"),
], ids=["2d", "3d", "segment"])
def test_a_finished_run_is_refused_before_any_work(tmp_path, capsys, argv, run):
    """Before: a second ``vispos train --tiny`` in the same folder silently replaced the first run's
    ``metrics.json``, ``ablation.md`` and ``curves.png``."""
    from vispos.app.cli import main

    out = tmp_path / "out"
    before = _finished(out / run, "checkpoint.pt")
    (out / "ablation.md").write_text("table")
    assert main(["train", *argv, "--out", str(out)]) == 2  # before torch is imported (CLI's own check)
    err = capsys.readouterr().err
    assert err == (f"vispos train: error: argument --out: {out / run}/ (metrics.json, checkpoint.pt) holds a finished "
                   "run, never replaced unless asked: give another --out, or --force to replace it\n")
    assert {p.name: p.read_bytes() for p in (out / run).iterdir()} == before
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["ablation.md", "checkpoint.pt", "metrics.json"]
    with pytest.raises(SystemExit) as info:  # the training core's check: the demos' entry points
        if argv[-1] == "segment":
            from vispos.app.train.segment3d import run as run_segment

            run_segment([*argv, "--out", str(out)])
        else:
            from vispos.app.train.cli import run

            if "--volume" in argv:
                from vispos.app.train.task3d import TASK
            else:
                from vispos.app.train.task2d import TASK
            run(TASK, [a for a in argv if a != "--volume"] + ["--out", str(out)])
    assert info.value.code == 2 and "holds a finished run" in capsys.readouterr().err


def test_force_and_resume_of_that_run_pass_and_other_arms_join(tmp_path):
    """``--force`` replaces; ``--resume`` of a checkpoint in the finished run's own folder continues
    it; another arm or seed under the same ``--out`` joins the report as before."""
    from vispos.app._train_args import check_train_args

    out = tmp_path / "out"
    _finished(out / "sine" / "seed0")
    for given in (["--force"], ["--seed", "1"], ["--pos", "grid"], ["--report"]):
        check_train_args(parse_train_args(["--tiny", "--out", str(out), *given]))  # nothing to refuse
    run = str(out / "sine" / "seed0")
    assert finished_run([run], resume=os.path.join(run, "checkpoint.pt")) is None
    assert "holds a finished run" in finished_run([run], resume=str(tmp_path / "elsewhere" / "checkpoint.pt"))
    assert finished_arms(str(out), ["none", "sine", "grid"], 0).endswith(
        "--force to replace it; or train the others: --pos none grid")  # a run of three arms stopped part way
    _finished(out / "grid" / "seed0")
    two = finished_run([run, str(out / "grid" / "seed0")])
    assert " and " in two and two.endswith("hold finished runs, never replaced unless asked: give another --out, or "
                                           "--force to replace them")
