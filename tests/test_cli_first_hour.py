"""A new user's first hour with the ``vispos`` command (vispos/app/_run_command.py, _progress.py,
_model_names.py, data/_args.py, cli.py): steady-state timings, progress on long work, a
suggestion for every mistyped name (answered before torch is imported), one error prefix per
command, what ``--version`` and a multi-frame image say, and docs/cli.md's list of configs."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from vispos.app.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pos_time_is_the_median_after_warm_up_and_the_first_call_is_apart():
    """Before: the column was the median of 5 calls from cold, 32-48 ms where a steady call takes
    0.2-0.35 ms (the README's speed table is steady state)."""
    pytest.importorskip("torch")
    from vispos.app._run_args import WARMUP_CALLS
    from vispos.app._run_command import _timings_ms

    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= 2:  # two cold calls: the first is shown apart, the second is a warm-up
            time.sleep(0.05)

    first, steady = _timings_ms(fn, repeats=4)
    assert len(calls) == 1 + WARMUP_CALLS + 4
    assert first >= 50 and steady < 25


def test_progress_shows_only_when_work_is_long():
    """Before: a 4000x3000 photo through the default ResNet-50 ran 75 s with no output."""
    from vispos.app._progress import DELAY_S, StageProgress

    assert DELAY_S == 2.0
    quick = io.StringIO()
    with StageProgress(["read", "backbone"], "vispos run", file=quick) as progress:
        with progress.stage("read"):
            pass
    assert quick.getvalue() == ""
    slow = io.StringIO()
    with StageProgress(["read", "backbone"], "vispos run", delay=0.25, interval=0.02, file=slow) as progress:
        with progress.stage("read"):
            pass
        with progress.stage("backbone"):
            time.sleep(0.6)  # one long call that reports nothing itself: the bar still moves
    shown = slow.getvalue()
    assert "vispos run: now backbone (1/2 stages done) [00:00]" in shown and "now read" not in shown, shown
    with pytest.raises(ValueError, match="stages must name at least one stage"):
        StageProgress([], "x")


def test_progress_goes_to_a_terminal_only(monkeypatch):
    """On stderr the bar is drawn only when stderr is a terminal: redrawn in place, it would be
    noise in a log or a pipe."""
    from vispos.app._progress import StageProgress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, shown in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        with StageProgress(["backbone"], "vispos run", delay=0.0, interval=0.02) as progress:
            with progress.stage("backbone"):
                time.sleep(0.05)
        assert ("vispos run: now backbone" in stream.getvalue()) is shown


def test_model_names_are_the_libraries_own_lists():
    """The torch-free read of timm's and torchvision's registered names equals their
    ``list_models()``: the suggestion for ``--backbone resnet_18`` comes before torch is imported."""
    timm = pytest.importorskip("timm")
    torchvision = pytest.importorskip("torchvision")
    from vispos.app._model_names import model_names

    assert model_names("timm") == frozenset(timm.list_models())
    assert model_names("torchvision") == frozenset(torchvision.models.list_models(module=torchvision.models))


@pytest.mark.parametrize("argv, message", [
    (["train", "--backbone", "resnet_18"], "vispos train: error: argument --backbone: 'resnet_18' is not a timm model "
                                           "name; did you mean 'resnet18', 'resnetv2_18' or 'resnet18d'? (vit: a "
                                           "small ViT)"),
    (["train", "--backbone", "resnet18x"], "vispos train: error: argument --backbone: 'resnet18x' is not a timm model "
                                           "name; did you mean 'resnet18', "),
    (["plot", "similarty"], "vispos plot: error: unknown plot kind 'similarty'; did you mean 'similarity'? "
                            "(expected one of channels,"),
    (["plot", "batch", "--samples", "astronot"], "vispos plot: error: --samples: unknown scikit-image sample "
                                                 "'astronot'; did you mean 'astronaut'?"),
    (["demo", "--samples", "camra"], "vispos demo: error: --samples: unknown scikit-image sample 'camra'; did you "
                                     "mean 'camera'?"),
    (["config", "show", "detr_resnet19"], "vispos config: error: config file 'detr_resnet19' does not exist"),
    (["train", "--pos", "sin"], "vispos train: error: argument --pos: invalid choice: 'sin' (choose from 'none', "
                                "'grid', 'sine'); did you mean 'sine'?"),
    (["trian"], "vispos: error: argument command: invalid choice: 'trian' (choose from 'demo', 'run', 'plot', "
                "'config', 'train'); did you mean 'train'?"),
    (["run", "--images", "a.png", "--config", "{bad}"], "vispos run: error: --config {bad}: backbone model_name: "
                                                        "'resnet_50' is not a timm model name; did you mean 'resnet50'"),
])
def test_every_typed_name_gets_a_suggestion_before_torch(tmp_path, argv, message):
    """Each answer is one line with the command's own prefix, and comes before torch is imported
    (before: ``--backbone resnet_18`` took 5.7-8.1 s and suggested nothing)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("type: Joiner\nbackbone: {type: TimmBackbone, model_name: resnet_50, out_indices: [4]}\n"
                   "position_embedding: {type: PositionEmbeddingSine, num_pos_feats: 64}\n")
    argv = [a.format(bad=bad) for a in argv]
    script = ("import sys\nfrom vispos.app.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n"
              "    rc = e.code\nassert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", script, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(message.format(bad=bad)), proc.stderr
    if argv[0] in ("config", "trian") or "did you mean" in message:
        assert re.search(r"did you mean '(detr_resnet18|train|resnet18|similarity|astronaut|camera|sine|resnet50)'",
                         proc.stderr), proc.stderr


def test_every_listed_sample_loads():
    """``--samples`` takes every scikit-image sample that loads without a download, not only the
    four defaults."""
    pytest.importorskip("skimage")
    from vispos.app.data import sample_images
    from vispos.app.data._args import SAMPLE_IMAGES, SAMPLE_NAMES

    assert set(SAMPLE_IMAGES) <= set(SAMPLE_NAMES) and {"moon", "camera", "coins"} <= set(SAMPLE_NAMES)
    loaded = sample_images(SAMPLE_NAMES, max_size=16)
    assert [n for n, _ in loaded] == list(SAMPLE_NAMES)
    assert all(t.shape[0] == 3 and max(t.shape[1:]) == 16 for _, t in loaded)
    with pytest.raises(ValueError, match=r"unknown scikit-image sample 'data_dir'"):
        sample_images(["data_dir"])


def test_version_names_the_package_that_runs(tmp_path):
    import vispos

    proc = subprocess.run([sys.executable, "-m", "vispos.app.cli", "--version"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout == f"vispos {vispos.__version__} from {os.path.dirname(vispos.__file__)}\n"


@pytest.mark.parametrize("kind", ["tiff", "gif"])
def test_a_multi_frame_image_says_frame_0_is_used(tmp_path, kind, capsys):
    """Before: a multipage TIFF or an animated GIF was read with no word that only its first frame
    was used."""
    pytest.importorskip("torch")
    from vispos.app.data import load_image

    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)) for _ in range(3)]
    path = tmp_path / f"many.{kind}"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    with pytest.warns(UserWarning, match=r"holds 3 frames \(a multipage or animated image\); frame 0 is used"):
        image = load_image(path)
    assert tuple(image.shape) == (3, 20, 30)
    single = tmp_path / "one.png"
    frames[0].save(single)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_image(single)


def test_threads_0_is_refused_or_says_all_cores(capsys):
    from vispos.app._train_args import parse_train_args
    from vispos.app.train._args import build_parser
    from vispos.app.train._task_args import FLAGS_2D

    with pytest.raises(SystemExit):
        main(["demo", "--threads", "0"])
    assert "argument --threads: must be >= 1, got 0" in capsys.readouterr().err
    assert parse_train_args(["--threads", "0"]).threads == 0
    text = " ".join(build_parser(FLAGS_2D, prog="vispos train", command=True).format_help().split())
    assert "--threads THREADS torch threads per process (default 0: all cores" in text


def test_docs_cli_lists_every_shipped_config():
    """Before: docs/cli.md's config list left out detr_resnet18."""
    from vispos.config import packaged_configs

    with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as f:
        text = f.read()
    listed = re.search(r"<!-- configs -->(.*?)<!-- /configs -->", text, re.S)
    assert listed, "docs/cli.md: the list of configs is gone"
    assert re.findall(r"^- `(\w+)`", listed[1], re.M) == sorted(packaged_configs())
