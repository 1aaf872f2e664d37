"""demos/train_detr.py (the 2D task of the shared core): the CLI runs on tiny settings, every flag
is checked before work starts (exit 2, the flag named), ``--tiny`` only sets defaults, and the data
has exact boxes that follow the transforms. The core itself: tests/test_detr_core.py and
tests/test_train_detr_dist.py."""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import box_convert, box_iou, generalized_box_iou

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("skimage")
pytest.importorskip("scipy")

import vispos  # noqa: E402
from demos import train_detr as T  # noqa: E402
from vispos.app.train.cli import run  # noqa: E402


@pytest.mark.slow
def test_cli_runs_tiny(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "demos.train_detr", "--steps", "20", "--tiny", "--threads", "1", "--out", str(out),
           "--pos", *T.POS_ARMS]  # --tiny alone trains one arm
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote" in proc.stdout
    for arm in T.POS_ARMS:
        m = json.loads((out / arm / "seed0" / "metrics.json").read_text())
        assert m["arm"] == arm and m["seed"] == 0 and m["steps"] == list(range(1, 21)) and m["world_size"] == 1
        for key in ("loss", "loss_last", "loss_ce", "loss_l1", "loss_giou", "lr", "seconds", "rss_mb", "padded_fraction"):
            assert len(m[key]) == 20 and all(np.isfinite(m[key])), key
        assert all(s > 0 for s in m["seconds"]) and all(r > 0 for r in m["rss_mb"])
        assert any(p > 0 for p in m["padded_fraction"])  # the batches are padded
        assert [e["step"] for e in m["eval"]] == [10, 20]
        for e in m["eval"]:
            assert all(0 <= e[k] <= 1 for k in ("mean_iou", "map", "ap50", "ap75"))
        # --tiny's warm-up of 5 steps, the drop to 0.1 from step int(0.8 * 20) on
        assert m["lr"][0] == pytest.approx(1e-3 / 5) and m["lr"][-1] == pytest.approx(1e-3 * 0.1)
    table = (out / "ablation.md").read_text()
    assert "| 0 | " in table and "(c) sine, mask-aware" in table and "| sine - grid | ap50 |" in table
    with Image.open(out / "curves.png") as im:
        assert im.format == "PNG" and im.size[0] > 600
    # --report rebuilds the same table from the metrics files alone (arms run as separate processes)
    (out / "ablation.md").unlink()
    (out / "curves.png").unlink()
    assert T.main(["--report", "--tiny", "--steps", "20", "--out", str(out)]) == 0
    assert (out / "ablation.md").read_text() == table
    assert (out / "curves.png").stat().st_size > 0


def _exit_message(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        T.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--steps", "-1"], "argument --steps: must be >= 1, got -1"),
    (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["--steps", "x"], "argument --steps: expected an int >= 1, got 'x'"),
    (["--eval-every", "0"], "argument --eval-every: must be >= 1"),
    (["--warmup", "0"], "argument --warmup: must be >= 1"),
    (["--warmup", "-1"], "argument --warmup: must be >= 1"),
    (["--photos", "0"], "argument --photos: must be >= 1"),
    (["--photos", "15"], "argument --photos: at most 14 training photographs"),
    (["--hidden", "30"], "argument --hidden: must be divisible by --heads 4, got 30"),
    (["--hidden", "36", "--heads", "3"], "argument --hidden: must be divisible by 8"),
    (["--hidden", "12", "--heads", "3"], "argument --hidden: must be divisible by 8"),
    (["--threads", "-1"], "argument --threads: must be >= 0"),
    (["--workers", "-1"], "argument --workers: must be >= 0"),
    (["--max-objects", "0"], "argument --max-objects: must be >= 1"),
    (["--scales", "0"], "argument --scales: must be >= 1"),
    (["--scales", "4096"], "argument --scales: must be <= 2048"),
    (["--photo-size", "5000"], "argument --photo-size: must be <= 2048"),
    (["--batch-size", "0"], "argument --batch-size: must be >= 1"),
    (["--lr", "-1"], "argument --lr: must be a finite number > 0, got -1"),
    (["--lr", "0"], "argument --lr: must be a finite number > 0"),
    (["--lr", "nan"], "argument --lr: must be a finite number > 0"),
    (["--eos-coef", "-0.1"], "argument --eos-coef: must be a finite number >= 0"),
    (["--dropout", "1"], "argument --dropout: must be in [0, 1)"),
    (["--queries", "0"], "argument --queries: must be >= 1"),
    (["--queries", "1", "--max-objects", "2"], "argument --queries: must be >= --max-objects 2"),
    (["--min-object", "60", "--max-object", "20"], "argument --min-object: must be <= --max-object 20, got 60"),
    (["--min-object", "2"], "argument --min-object: must be >= 4"),
    (["--max-object", "100", "--photo-size", "64"], "argument --max-object: must be <= --photo-size 64"),
    (["--eval-images", "0"], "argument --eval-images: must be >= 1"),
    (["--size-divisibility", "-1"], "argument --size-divisibility: must be >= 0"),
    (["--size-divisibility", "4096"], "argument --size-divisibility: must be <= the largest of --scales (64)"),
    (["--train-images", "1"], "argument --train-images: must hold at least one global batch"),
    (["--seed", "-1"], "argument --seed: must be >= 0"),
    (["--backbone", "no_such_model"], "argument --backbone: 'no_such_model' is not a timm model name"),
    (["--backbone", "resnet_18"], "argument --backbone: 'resnet_18' is not a timm model name; did you mean 'resnet18'"),
    (["--out-index", "9"], "argument --out-index:"),
    (["--device", "meta"], "argument --device: expected cpu or cuda"),
    (["--device", "nonsense"], "argument --device: not a torch device"),
    (["--norm", "sync"], "argument --norm: sync needs CUDA under torchrun"),
    (["--pos", "sine", "--resume", "/no/such/file.pt"], "argument --resume: no such checkpoint file"),
    (["--pos", "learned"], "argument --pos: invalid choice: 'learned'"),
    (["--hidden", "100000"], "argument --hidden: must be <= 4096, got 100000"),  # was a 120 GB allocation
    (["--ffn", "100000"], "argument --ffn: must be <= 16384"),
    (["--queries", "100000"], "argument --queries: must be <= 1000"),
    (["--dec-layers", "1000"], "argument --dec-layers: must be <= 24"),
    (["--eval-images", "100000"], "argument --eval-images: must be <= 10000"),
    (["--eval-batch-sizes", "0"], "argument --eval-batch-sizes: must be >= 1, got 0"),
    (["--eval-batch-sizes", "8", "1", "8"], "argument --eval-batch-sizes: each size once, got [8, 1, 8]"),
    (["--eval-batch-sizes", "2000"], "argument --eval-batch-sizes: must be <= 1024, got [2000]"),
])
def test_every_flag_is_checked_before_work_starts(capsys, argv, message):
    assert message in _exit_message(capsys, ["--tiny", *argv])


def test_out_must_not_be_a_file(tmp_path, capsys):
    path = tmp_path / "a_file"
    path.write_text("x")
    assert f"argument --out: '{path}' exists and is not a folder" in _exit_message(capsys, ["--out", str(path)])
    assert f"argument --report: no run under '{tmp_path}'" in _exit_message(capsys, ["--report", "--out", str(tmp_path)])


def _fake_metrics(arm, seed, ap50):
    n = 30
    return {
        "task": "2d", "arm": arm, "seed": seed, "steps": list(range(1, n + 1)), "world_size": 1, "global_batch": 8,
        "args": {"eval_every": 10, "lr": 1e-3, "seed": seed, "steps": n}, "loss_last": [1.0] * n,
        "seconds": [0.1] * n, "rss_mb": [100.0] * n,
        "eval": [{"step": s, "mean_iou": 0.4, "map": ap50 / 3, "ap50": ap50, "ap75": ap50 / 4} for s in (10, 20, 30)],
    }


def test_report_joins_every_arm_and_seed_present(tmp_path):
    """Arms and seeds trained by separate processes (the ablation's lanes), some still running:
    --report joins every finished run, whatever --pos says, pairs arms over their common seeds and
    says plainly whether they are level."""
    ap50 = {"none": {0: 0.01, 1: 0.0}, "grid": {0: 0.20, 1: 0.30, 2: 0.25}, "sine": {0: 0.22, 1: 0.27, 2: 0.26, 3: 0.4}}
    for arm, by_seed in ap50.items():
        for seed, v in by_seed.items():
            (tmp_path / arm / f"seed{seed}").mkdir(parents=True)
            (tmp_path / arm / f"seed{seed}" / "metrics.json").write_text(json.dumps(_fake_metrics(arm, seed, v)))
    (tmp_path / "grid" / "seed4").mkdir()  # in flight: no metrics.json yet
    logs = []
    assert run(T.TASK, ["--report", "--pos", "sine", "--out", str(tmp_path)], log=logs.append) == 0
    table = (tmp_path / "ablation.md").read_text()
    assert logs[0] == table
    assert "| seed | (a) none | (b) grid, mask-blind | (c) sine, mask-aware |" in table
    assert "| 3 | - | - | 0.400 / 0.133 / 0.400 / 0.100 |" in table
    assert "| (b) grid, mask-blind | 3 | 0.400 ± 0.000 | 0.083 ± 0.017 | 0.250 ± 0.050 |" in table
    # sine - grid over seeds 0-2 only (seed 3 has no grid run): +0.02, -0.03, +0.01
    assert "| sine - grid | ap50 | +0.020, -0.030, +0.010 | +0.000 ± 0.026 | 2 / 1 / 0 |" in table
    assert ("- sine vs grid, ap50 (last 3) over seeds [0, 1, 2]: sine - grid = +0.000 ± 0.026; sine better on 2 "
            "seed(s), grid on 1, 0 tie(s); **the arms are level**") in table
    assert "| sine - none | ap50 | +0.210, +0.270 |" in table and "| grid - none | ap50 | +0.190, +0.300 |" in table
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_tiny_sets_defaults_only():
    from vispos.app.train.cli import parse_args

    _, tiny = parse_args(T.TASK, ["--tiny", "--steps", "20"])
    assert (tiny.batch_size, tiny.eval_images, tiny.photo_size, tiny.scales) == (2, 4, 64, [48, 64])
    assert (tiny.min_object, tiny.max_object, tiny.photos, tiny.eval_every, tiny.memory_warmup) == (8, 24, 3, 10, 10)
    explicit = ["--tiny", "--steps", "20", "--batch-size", "5", "--eval-images", "7", "--photo-size", "96",
                "--scales", "80", "96", "--min-object", "10", "--max-object", "30", "--photos", "14",
                "--eval-every", "300", "--memory-warmup", "40", "--hidden", "64", "--queries", "10"]
    _, a = parse_args(T.TASK, explicit)
    assert (a.batch_size, a.eval_images, a.photo_size, a.scales) == (5, 7, 96, [80, 96])
    assert (a.min_object, a.max_object, a.photos, a.eval_every, a.memory_warmup, a.hidden, a.queries) == (
        10, 30, 14, 300, 40, 64, 10)
    _, full = parse_args(T.TASK, [])
    assert (full.batch_size, full.eval_every, full.photo_size, full.hidden, full.memory_warmup) == (8, 300, 128, 64, 600)
    # held-out batches: the demo's, then one item at a time, unless given (independent of --batch-size)
    assert (full.eval_batch_sizes, tiny.eval_batch_sizes, a.eval_batch_sizes) == ([8, 1], [2, 1], [5, 1])
    assert parse_args(T.TASK, ["--batch-size", "1"])[1].eval_batch_sizes == [1]
    assert parse_args(T.TASK, ["--batch-size", "1", "--eval-batch-sizes", "8", "1"])[1].eval_batch_sizes == [8, 1]
    # a task's own defaults (3D: a width divisible by 6 and 8), then --tiny's, then explicit flags
    import dataclasses

    task = dataclasses.replace(T.TASK, defaults={"hidden": 96, "lr": 5e-4}, tiny_defaults={**T.TASK.tiny_defaults, "hidden": 48})
    assert (parse_args(task, [])[1].hidden, parse_args(task, [])[1].lr) == (96, 5e-4)
    assert parse_args(task, ["--tiny"])[1].hidden == 48 and parse_args(task, ["--tiny", "--hidden", "64"])[1].hidden == 64


def test_draw_objects_boxes_are_exact():
    photo = torch.rand(3, 60, 80)
    for seed in range(5):
        image, boxes, labels = T.draw_objects(photo, np.random.default_rng(seed), 3, 8, 24)
        assert image.shape == photo.shape and len(boxes) == len(labels) >= 1
        assert labels.dtype == torch.int64 and set(labels.tolist()) <= set(range(len(T.CLASSES)))
        changed = (image != photo).any(0)
        covered = torch.zeros_like(changed)
        for x0, y0, x1, y1 in boxes.long().tolist():
            region = changed[y0:y1, x0:x1]
            # tight: every border row and column of the box holds drawn pixels
            assert region[0].any() and region[-1].any() and region[:, 0].any() and region[:, -1].any()
            covered[y0:y1, x0:x1] = True
        assert not (changed & ~covered).any()  # nothing drawn outside the boxes
        ious = box_iou(boxes, boxes) - torch.eye(len(boxes))
        assert (ious == 0).all()  # objects do not overlap


def test_dataset_items_are_deterministic_and_boxes_follow_the_transforms():
    photos = [torch.rand(3, 48, 64), torch.rand(3, 64, 40)]
    ds = T.ShapesOnPhotos(photos, 6, seed=3, scales=(40, 56), train=True, min_size=8, max_size=20)
    sizes = set()
    for i in range(len(ds)):
        (a, ta), (b, tb) = ds[i], ds[i]
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(ta["boxes"], tb["boxes"], rtol=0, atol=0)
        assert type(a) is torch.Tensor and max(a.shape[1:]) in (40, 56)
        sizes.add(tuple(a.shape[1:]))
        assert ((ta["boxes"] >= 0) & (ta["boxes"] <= 1)).all()
    assert len(sizes) > 1  # multi-scale: batches will be padded


def test_held_out_items_follow_a_reference_pipeline():
    """Held-out items (no flip) against resize written with torchvision's functional API."""
    from torchvision.transforms.v2 import functional as TF

    photo = torch.rand(3, 50, 70)
    ds = T.ShapesOnPhotos([photo], 4, seed=5, scales=(35, 42), train=False, min_size=8, max_size=20)
    for i in range(4):
        image, target = ds[i]
        rng = np.random.default_rng([5, i])
        rng.integers(1)  # the photo choice
        drawn, boxes, labels = T.draw_objects(photo, rng, 3, 8, 20)
        longer = (35, 42)[i % 2]
        h, w = round(50 * longer / 70), longer
        ref = TF.resize(drawn, [h, w], antialias=True)
        ref = TF.normalize(ref, vispos.app.data.IMAGENET_MEAN, vispos.app.data.IMAGENET_STD)
        torch.testing.assert_close(image, ref, rtol=1e-5, atol=1e-5)
        scale = torch.tensor([w / 70, h / 50, w / 70, h / 50])
        ref_boxes = box_convert(boxes * scale, "xyxy", "cxcywh") / torch.tensor([w, h, w, h])
        torch.testing.assert_close(target["boxes"], ref_boxes)
        torch.testing.assert_close(target["labels"], labels, rtol=0, atol=0)


#: a tiny run of one arm, small enough for a few seconds a run
RESUME_TINY = ["--tiny", "--pos", "sine", "--eval-images", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A --tiny run of 2 steps (its --train-images and --memory-warmup derived from --steps) and its
    checkpoint."""
    out = tmp_path_factory.mktemp("tiny")
    threads = torch.get_num_threads()
    try:
        assert run(T.TASK, [*RESUME_TINY, "--steps", "2", "--save-every", "2", "--out", str(out)],
                     log=lambda *_: None) == 0
    finally:
        torch.set_num_threads(threads)
    return out / "sine" / "seed0" / "checkpoint.pt"


def test_tiny_run_resumes_for_more_steps(tiny_checkpoint, tmp_path):
    """--tiny derives --train-images (steps x batch) from --steps: the resumed run keeps the
    checkpoint's count (its data), and the schedule keeps the checkpoint's decay step."""
    first = torch.load(tiny_checkpoint, weights_only=True)
    assert first["args"]["train_images"] == 4 and first["args"]["steps"] == 2
    out = tmp_path / "more"
    logs = []
    threads = torch.get_num_threads()
    try:
        assert run(T.TASK, [*RESUME_TINY, "--steps", "5", "--save-every", "5", "--out", str(out),
                              "--resume", str(tiny_checkpoint)], log=logs.append) == 0
    finally:
        torch.set_num_threads(threads)
    assert any("resumed from" in line and "at step 2" in line for line in logs)
    m = json.loads((out / "sine" / "seed0" / "metrics.json").read_text())
    assert m["steps"] == [1, 2, 3, 4, 5] and m["resumed_at"] == [2]
    assert m["loss"][:2] == first["metrics"]["loss"] and m["lr"][:2] == first["metrics"]["lr"]
    assert m["args"]["steps"] == 5 and m["args"]["train_images"] == 4  # this run's settings, the checkpoint's data
    # --tiny's warm-up of 5 steps, decay at int(0.8 * 2) = 1 (the first run's): 1e-3 * (s + 1) / 5 * 0.1
    assert m["lr"] == pytest.approx([1e-3 * (s + 1) / 5 * (0.1 if s >= 1 else 1) for s in range(5)])
    last = torch.load(out / "sine" / "seed0" / "checkpoint.pt", weights_only=True)
    assert last["step"] == 5 and last["args"]["train_images"] == 4
    assert not all(torch.equal(a, last["model"][k]) for k, a in first["model"].items())  # it trained on


@pytest.mark.parametrize("extra, message", [
    (["--lr", "2e-3", "--batch-size", "3"],
     "argument --resume: the settings differ from the checkpoint's: --batch-size (checkpoint 2, given 3), "
     "--lr (checkpoint 0.001, given 0.002); a resumed run keeps every setting of its checkpoint except "
     "--device, --eval-batch-sizes, --eval-beside-largest, --eval-every, --force, --memory-warmup, --out, --save-every, "
     "--steps, --threads, --workers"),
    (["--train-images", "6"], "--train-images (checkpoint 4, given 6)"),
    (["--pos", "grid"], "argument --resume: the checkpoint is of arm 'sine', this run trains 'grid'"),
    (["--steps", "1"], "argument --resume: the checkpoint is at step 2; --steps must be >= 2, got 1"),
])
def test_resume_with_other_settings_is_one_line_exit_2(tiny_checkpoint, tmp_path, capsys, extra, message):
    """Not a traceback with exit 1: argparse's exit 2 and one line naming each differing flag with
    the checkpoint's value and the given one, and what may differ."""
    err = _exit_message(capsys, [*RESUME_TINY, "--steps", "4", "--out", str(tmp_path), *extra,
                                 "--resume", str(tiny_checkpoint)])
    assert message in err and "Traceback" not in err
    assert ": error: " in err.splitlines()[-1] and message in err.splitlines()[-1]  # one line
    assert not (tmp_path / "sine").exists()  # refused before any work


def test_resume_of_a_file_that_is_no_checkpoint_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    err = _exit_message(capsys, [*RESUME_TINY, "--resume", str(bad)])
    assert f"argument --resume: '{bad}' is not a readable checkpoint" in err and "Traceback" not in err


def test_resume_takes_a_flag_the_checkpoint_does_not_record_at_its_default(tiny_checkpoint, tmp_path, capsys):
    """A checkpoint written before a flag existed resumes when the flag is at its default (the
    behaviour the run had), and names the flag otherwise."""
    from vispos.app.train.cli import parse_args

    state = torch.load(tiny_checkpoint, weights_only=True)
    del state["args"]["pre_norm"]
    old = tmp_path / "old.pt"
    torch.save(state, old)
    _, args = parse_args(T.TASK, [*RESUME_TINY, "--steps", "4", "--out", str(tmp_path), "--resume", str(old)])
    assert args.train_images == 4 and args.pre_norm is False
    err = _exit_message(capsys, [*RESUME_TINY, "--steps", "4", "--pre-norm", "--out", str(tmp_path), "--resume", str(old)])
    assert "argument --resume: the settings differ from the checkpoint's: --pre-norm (checkpoint False, given True)" in err


def test_evaluation_in_several_compositions_independent_of_the_training_batch(tmp_path):
    """DETR's failure experiment's flags: trained one image per step (no padding), evaluated in
    batches of 3 (the headline, every evaluation), one image at a time and beside the largest
    held-out image (the last 3 evaluations). The recorded numbers are those of the final model
    evaluated by hand in each composition."""
    from vispos.app.train import SetCriterion, evaluate
    from vispos.app.train.distributed import DistContext

    argv = ["--tiny", "--pos", "grid", "--steps", "4", "--eval-every", "1", "--batch-size", "1", "--eval-images", "5",
            "--eval-batch-sizes", "3", "1", "--eval-beside-largest", "--out", str(tmp_path)]
    models, logs = [], []
    run(T.TASK, argv, log=logs.append, on_step=lambda step, model: models.append(model))
    m = json.loads((tmp_path / "grid" / "seed0" / "metrics.json").read_text())
    assert m["args"]["batch_size"] == 1 and m["padded_fraction"] == [0.0] * 4  # training saw no padding
    assert m["eval_compositions"] == ["batch3", "batch1", "beside_largest"]
    assert [e["step"] for e in m["eval"]] == [1, 2, 3, 4]
    assert all([e["step"] for e in m["eval_by_composition"][k]] == [2, 3, 4] for k in m["eval_compositions"])
    assert m["eval_by_composition"]["batch3"] == m["eval"][1:]
    assert any(line.startswith("[grid] step 4 held-out ap50 by composition: batch3 ") for line in logs)
    # by hand, with the final model
    from vispos.app.train.cli import parse_args

    _, args = parse_args(T.TASK, argv)
    _, held = T.TASK.build_datasets(args)
    items = [held[i] for i in range(5)]
    cells = [im.shape[1] * im.shape[2] for im, _ in items]
    largest = max(range(5), key=lambda i: cells[i])
    collate = vispos.PaddedCollate()
    by_hand = {
        "batch3": [collate(items[:3]), collate(items[3:])],
        "batch1": [collate([it]) for it in items],
        "beside_largest": [(*collate([it, items[largest if i != largest else sorted(range(5), key=lambda j: -cells[j])[1]]]), 1)
                           for i, it in enumerate(items)],
    }
    task, criterion = T.TASK, SetCriterion(3, T.TASK.box_ops, 2.0, 5.0, 2.0, 0.1)
    for key, batches in by_hand.items():
        ev = evaluate(models[-1], batches, criterion, task, DistContext())
        assert m["eval_by_composition"][key][-1] == {"step": 4, **{k: round(v, 5) for k, v in ev.items()}}, key


def _fake_composition_metrics(arm, seed, ap50, alone):
    m = _fake_metrics(arm, seed, ap50)
    m["eval_compositions"] = ["batch8", "batch1"]
    m["eval_by_composition"] = {
        "batch8": m["eval"],
        "batch1": [{**e, "ap50": alone} for e in m["eval"]],
    }
    return m


def test_report_by_evaluation_composition(tmp_path):
    """Per arm and seed, the headline in every composition and its difference from alone; per arm,
    batch - alone paired over seeds with the report's rule; arms compared in each composition."""
    # grid: batch 8 below alone on every seed (the padding costs it); sine: the same alone and in batches
    values = {"grid": [(0.20, 0.25), (0.30, 0.36), (0.25, 0.29), (0.22, 0.28), (0.27, 0.31)],
              "sine": [(0.21, 0.21), (0.33, 0.33), (0.26, 0.26), (0.24, 0.24), (0.30, 0.30)]}
    for arm, by_seed in values.items():
        for seed, (batch, alone) in enumerate(by_seed):
            (tmp_path / arm / f"seed{seed}").mkdir(parents=True)
            (tmp_path / arm / f"seed{seed}" / "metrics.json").write_text(
                json.dumps(_fake_composition_metrics(arm, seed, batch, alone)))
    # an older run without compositions is left out of the composition tables only
    (tmp_path / "none" / "seed0").mkdir(parents=True)
    (tmp_path / "none" / "seed0" / "metrics.json").write_text(json.dumps(_fake_metrics("none", 0, 0.01)))
    assert T.main(["--report", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "ablation.md").read_text()
    assert "in the headline composition, batch 8)" in table
    assert "| arm | seed | batch 8 | batch 1 | batch 8 - alone |" in table
    assert "| (b) grid, mask-blind | 0 | 0.200 | 0.250 | -0.050 |" in table
    assert "| (c) sine, mask-aware | 4 | 0.300 | 0.300 | +0.000 |" in table
    assert "| (b) grid, mask-blind | batch 8 - alone | ap50 | -0.050, -0.060, -0.040, -0.060, -0.040 | -0.050 ± 0.010 | 0 / 5 / 0 |" in table
    assert "| higher alone |" in table
    assert ("- grid, ap50 (last 3) over seeds [0, 1, 2, 3, 4]: batch 8 - alone = -0.050 ± 0.010; higher at batch 8 on 0 "
            "seed(s), alone on 5, 0 tie(s); **the batch changes it: higher alone**") in table
    assert ("- sine, ap50 (last 3) over seeds [0, 1, 2, 3, 4]: batch 8 - alone = +0.000 ± 0.000; higher at batch 8 on 0 "
            "seed(s), alone on 0, 5 tie(s); **level: the report's rule calls no difference**") in table
    # the arms compared in the headline composition (as before) and alone
    assert "| sine - grid | ap50 | +0.010, +0.030, +0.010, +0.020, +0.030 | +0.020 ± 0.010 | 5 / 0 / 0 |" in table
    assert "| sine - grid | ap50 at batch 1 | -0.040, -0.030, -0.030, -0.040, -0.010 | -0.030 ± 0.012 | 0 / 5 / 0 |" in table
    assert "- sine vs grid, ap50 at batch 1 (last 3) over seeds [0, 1, 2, 3, 4]: sine - grid = -0.030 ± 0.012" in table
    assert "- sine vs grid, ap50 (last 3) over seeds [0, 1, 2, 3, 4]: sine - grid = +0.020 ± 0.010" in table
    assert "(a) none | 0 |" not in table  # no composition recorded
