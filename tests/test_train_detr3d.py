"""demos/train_detr3d.py: the 3D task on the shared DETR core. MONAI's 3D box geometry against a
slow reference, MONAI's AP on hand-made cases, the MONAI ResNet through VolumeBackbone, flag
validation, a single batch overfitted, and the CLI on tiny settings."""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("monai")
pytest.importorskip("scipy")
pytest.importorskip("nilearn")

import vispos  # noqa: E402
from demos import train_detr3d as T  # noqa: E402
from vispos.app.train.cli import run  # noqa: E402
from vispos.app.train import SetCriterion, build_model  # noqa: E402
from vispos.app.train.cli import parse_args  # noqa: E402
from vispos.app.train.report import TINY_NOTE  # noqa: E402

OPS = T.BOX_OPS_3D


def _random_boxes(n, seed):
    g = torch.Generator().manual_seed(seed)
    center = torch.rand(n, 3, generator=g, dtype=torch.float64)
    size = 0.05 + 0.5 * torch.rand(n, 3, generator=g, dtype=torch.float64)
    return torch.cat([center, size], 1)


def _slow_iou_giou(a, b):
    """3D IoU and GIoU (Rezatofighi et al. 2019) of corner boxes, one pair at a time."""
    iou = np.zeros((len(a), len(b)))
    giou = np.zeros((len(a), len(b)))
    for i, j in itertools.product(range(len(a)), range(len(b))):
        lo, hi = np.maximum(a[i, :3], b[j, :3]), np.minimum(a[i, 3:], b[j, 3:])
        inter = np.prod(np.clip(hi - lo, 0, None))
        va, vb = np.prod(a[i, 3:] - a[i, :3]), np.prod(b[j, 3:] - b[j, :3])
        union = va + vb - inter
        hull = np.prod(np.maximum(a[i, 3:], b[j, 3:]) - np.minimum(a[i, :3], b[j, :3]))
        iou[i, j] = inter / union
        giou[i, j] = inter / union - (hull - union) / hull
    return iou, giou


def test_box_ops_match_a_slow_reference():
    a, b = _random_boxes(7, 0), _random_boxes(5, 1)
    ca, cb = OPS.to_corners(a), OPS.to_corners(b)
    torch.testing.assert_close(ca, torch.cat([a[:, :3] - a[:, 3:] / 2, a[:, :3] + a[:, 3:] / 2], 1))
    iou, giou = _slow_iou_giou(ca.numpy(), cb.numpy())
    # MONAI computes in float32 and adds a small epsilon to the union
    torch.testing.assert_close(OPS.iou(ca, cb).double(), torch.from_numpy(iou), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(OPS.giou(ca, cb).double(), torch.from_numpy(giou), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(OPS.size_scale(torch.tensor([10.0, 20.0, 30.0])),
                               torch.tensor([10.0, 20.0, 30.0, 10.0, 20.0, 30.0]))
    # GIoU is differentiable (the criterion's loss) and the caller's boxes are not modified
    x = a.float().clone().requires_grad_(True)
    before = x.detach().clone()
    OPS.giou(OPS.to_corners(x), OPS.to_corners(b.float())).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    torch.testing.assert_close(x.detach(), before, rtol=0, atol=0)


def _pred(boxes, scores, labels):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 6),
            "scores": torch.tensor(scores, dtype=torch.float32), "labels": torch.tensor(labels, dtype=torch.int64)}


def _gt(boxes, labels):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 6), "labels": torch.tensor(labels)}


def test_monai_ap_on_hand_made_cases():
    gt = [_gt([[0, 0, 0, 10, 10, 10]], [0])]
    perfect = T.monai_ap([_pred([[0, 0, 0, 10, 10, 10]], [0.9], [0])], gt)
    assert perfect == pytest.approx({"ap25": 1.0, "ap50": 1.0, "map": 1.0})
    # shifted by 4 voxels along D: IoU 600 / 1400 = 0.43, above 0.10 .. 0.40 (7 of 9 thresholds)
    shifted = T.monai_ap([_pred([[4, 0, 0, 14, 10, 10]], [0.9], [0])], gt)
    assert shifted == pytest.approx({"ap25": 1.0, "ap50": 0.0, "map": 7 / 9})
    assert T.monai_ap([_pred([[0, 0, 0, 10, 10, 10]], [0.9], [1])], gt) == pytest.approx(
        {"ap25": 0.0, "ap50": 0.0, "map": 0.0})  # the wrong class
    assert T.monai_ap([_pred([], [], [])], gt) == {"ap25": 0.0, "ap50": 0.0, "map": 0.0}
    # two volumes, one class each: the class mean; a false positive ranked above the true one
    gts = [_gt([[0, 0, 0, 10, 10, 10]], [0]), _gt([[5, 5, 5, 9, 9, 9]], [1])]
    preds = [_pred([[0, 0, 0, 10, 10, 10], [20, 20, 20, 24, 24, 24]], [0.5, 0.8], [0, 0]),
             _pred([[5, 5, 5, 9, 9, 9]], [0.7], [1])]
    out = T.monai_ap(preds, gts)
    # class 0: precision 1/2 at recall 1 (COCO's 101-point interpolation); class 1: 1
    assert out["ap25"] == pytest.approx((0.5 + 1.0) / 2) and out["ap50"] == pytest.approx(0.75)


def _args(extra=()):
    _, args = parse_args(T.TASK, ["--tiny", "--steps", "20", *extra])
    args.train_images = 16
    return args


def test_backbone_is_a_monai_resnet_at_stride_8():
    from monai.networks.nets import ResNet

    args = _args()
    bb = T.build_backbone(args)
    assert isinstance(bb, vispos.backbones.VolumeBackbone) and bb.model_name == ResNet.__name__
    assert bb.num_channels == [args.widths[-1]] and bb.strides == [8] and bb.num_axes == 3
    nested = vispos.nested_tensor_from_tensor_list([torch.randn(1, 17, 24, 20), torch.randn(1, 24, 12, 16)])
    (level,) = bb(nested)
    assert level.tensors.shape == (2, args.widths[-1], 3, 3, 3)
    # DETR's rule: the input mask resized by nearest neighbour to the level
    expected = torch.nn.functional.interpolate(nested.mask[None].float(), size=(3, 3, 3))[0].bool()
    assert torch.equal(level.mask, expected) and level.mask[1].any() and not level.mask[0].all()
    default = T.build_backbone(parse_args(T.TASK, [])[1])  # one stage: stride 4
    assert default.num_channels == [16] and default.strides == [4] == [T.backbone_stride([16])]


def test_arms_start_from_the_same_weights():
    args = _args()
    models = {arm: build_model(T.TASK, arm, args) for arm in T.POS_ARMS}
    ref = models["sine"].state_dict()
    for arm in ("none", "grid"):
        state = models[arm].state_dict()
        assert state.keys() == ref.keys()
        for k in ref:
            torch.testing.assert_close(state[k], ref[k], rtol=0, atol=0)
    assert models["sine"].num_axes == 3 and models["sine"].bbox_embed.layers[-1].out_features == 6


@pytest.mark.parametrize("argv, flag", [
    (["--crop", "30", "20"], "--crop"),
    (["--crop", "4", "20"], "--crop"),
    (["--min-object", "9", "--max-object", "8"], "--min-object"),
    (["--max-object", "30"], "--max-object"),
    (["--contrast", "3", "1"], "--contrast"),
    (["--volumes", "brain"], "--volumes"),
    (["--heldout-volumes", "mni152_t1"], "--heldout-volumes"),
    (["--hidden", "64"], "--hidden"),
    (["--widths", "8", "8", "8", "8", "8"], "--widths"),
    (["--widths", "8", "8", "8"], "--crop"),  # stride 16 > the smallest crop side (12)
    (["--spacing", "0"], "--spacing"),
    (["--spacing", "1e9"], "--spacing"),  # every volume shrinks below one feature cell
    (["--stem-kernel", "999"], "--stem-kernel"),
    (["--size-divisibility", "4096"], "--size-divisibility"),  # larger than any crop: padding only  # a 64 GB stem, refused before it is built
    (["--crop", "20"], "--crop"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        T.main(["--tiny", "--steps", "2", "--out", "/nonexistent-never-written", *argv])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_smallest_extent_reads_the_header():
    from vispos.app.train.volumes3d import available_volumes, smallest_extent_mm

    if not available_volumes(["anatomical"]):
        pytest.skip("nibabel's test data is not installed")
    # nibabel's anatomical.nii: 33 x 41 x 25 voxels of 2 mm, so 66 x 82 x 50 mm
    assert smallest_extent_mm("anatomical") == pytest.approx(50.0)


def test_overfits_a_single_batch():
    """The whole 3D pipeline (MONAI ResNet -> Joiner -> encoder -> DETR decoder -> heads, MONAI
    GIoU loss, Hungarian matching) fits one padded batch of two real-volume crops."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what the demo runs with; two threads on a loaded 2-core CI run crawl
    try:
        _overfit()
    finally:
        torch.set_num_threads(threads)


def _overfit():
    torch.manual_seed(0)
    args = _args()
    train, _ = T.build_datasets(args)
    nested, targets = vispos.PaddedCollate()([train[i] for i in range(2)])
    assert nested.mask.any()  # padded
    model = build_model(T.TASK, "sine", args)
    criterion = SetCriterion(len(T.CLASSES), OPS, 2.0, 5.0, 2.0, 0.1)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    first = None
    for _ in range(250):
        losses = criterion(model(nested), targets)
        first = first if first is not None else float(losses["loss_last"])
        optim.zero_grad()
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optim.step()
    model.eval()
    with torch.no_grad():
        out = model(nested)
    matches = criterion.match(out["pred_logits"], out["pred_boxes"], targets)
    ious, correct = [], []
    for b, (rows, cols) in enumerate(matches):
        pred, gt = OPS.to_corners(out["pred_boxes"][b, rows]), OPS.to_corners(targets[b]["boxes"][cols])
        ious.append(torch.diagonal(OPS.iou(pred, gt)))
        correct.append(out["pred_logits"][b, rows].argmax(-1) == targets[b]["labels"][cols])
    assert float(losses["loss_last"]) < 0.15 * first
    assert torch.cat(ious).min() > 0.7, torch.cat(ious)
    assert torch.cat(correct).all()
    # unmatched queries say "no object"
    for b, (rows, _) in enumerate(matches):
        rest = torch.ones(out["pred_logits"].shape[1], dtype=torch.bool)
        rest[rows] = False
        assert (out["pred_logits"][b, rest].argmax(-1) == len(T.CLASSES)).all()


@pytest.mark.slow
def test_cli_runs_tiny(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "demos.train_detr3d", "--steps", "20", "--tiny", "--threads", "1", "--out", str(out),
           "--eval-beside-largest", "--pos", *T.POS_ARMS]  # --tiny alone trains one arm
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the 2D run's summary, the 3D task's own full run in its hint, and what "map" averages
    lines = proc.stdout.splitlines()
    assert lines[-1] == T.TASK.metric_legend and "map, AP averaged over IoU 0.10 to 0.50" in lines[-1]
    assert lines[-3] == TINY_NOTE.format(steps=20, metric="AP", compared="arm", full_steps=2000,
                                         doc="docs/training3d.md"), lines
    assert lines[-4].startswith("[sine] train loss, mean of steps 1-5 -> steps 16-20: "), lines
    for arm in T.POS_ARMS:
        m = json.loads((out / arm / "seed0" / "metrics.json").read_text())
        assert m["task"] == "3d" and m["arm"] == arm and m["steps"] == list(range(1, 21))
        for key in ("loss", "loss_ce", "loss_l1", "loss_giou", "seconds", "rss_mb", "padded_fraction"):
            assert len(m[key]) == 20 and all(np.isfinite(m[key])), key
        assert all(p > 0 for p in m["padded_fraction"])  # every batch is padded
        assert [e["step"] for e in m["eval"]] == [10, 20]
        assert all(0 <= e[k] <= 1 for e in m["eval"] for k in ("mean_iou", "ap25", "ap50", "map"))
        # the held-out crops in the demo's batches (the headline), alone and beside the largest crop
        assert m["eval_compositions"] == ["batch2", "batch1", "beside_largest"]
        assert m["eval_by_composition"]["batch2"] == m["eval"]
        for key in m["eval_compositions"]:
            assert [e["step"] for e in m["eval_by_composition"][key]] == [10, 20]
            assert all(0 <= e[k] <= 1 for e in m["eval_by_composition"][key] for k in ("mean_iou", "ap25", "ap50", "map"))
    table = (out / "ablation.md").read_text()
    assert "(c) sine, mask-aware" in table and "ap25" in table
    assert "| arm | seed | batch 2 | batch 1 | beside the largest | batch 2 - alone | beside the largest - alone |" in table
    assert "| (c) sine, mask-aware | beside the largest - alone | ap25 |" in table
    from PIL import Image

    with Image.open(out / "curves.png") as im:
        assert im.format == "PNG" and im.size[0] > 600
    # --report rebuilds the same table from the metrics files alone
    (out / "ablation.md").unlink()
    assert T.main(["--report", "--tiny", "--steps", "20", "--out", str(out)]) == 0
    assert (out / "ablation.md").read_text() == table
    with pytest.raises(SystemExit) as info:  # the same run again: refused, nothing replaced
        T.main(["--tiny", "--steps", "20", "--out", str(out)])
    assert info.value.code == 2 and (out / "ablation.md").read_text() == table


def _fake_3d_run(arm, seed, ap25):
    n = 30
    return {
        "task": "3d", "arm": arm, "seed": seed, "steps": list(range(1, n + 1)), "world_size": 1, "global_batch": 4,
        "args": {"eval_every": 10, "lr": 1e-3, "seed": seed}, "loss_last": [2.0] * n, "seconds": [0.2] * n,
        "rss_mb": [500.0] * n,
        "eval": [{"step": s, "mean_iou": 0.4, "ap25": ap25, "ap50": ap25 / 2, "map": ap25 / 3} for s in (10, 20, 30)],
    }


def test_report_joins_every_arm_and_seed_present(tmp_path):
    """--report (whatever --pos says) joins the runs of every arm and seed found under OUT, written
    by separate processes: per seed, mean ± std, and the paired sine - grid over common seeds."""
    present = {"sine": {0: 0.30, 1: 0.40, 2: 0.50}, "grid": {0: 0.20, 1: 0.45}, "none": {1: 0.05}}
    for arm, by_seed in present.items():
        for seed, ap25 in by_seed.items():
            d = tmp_path / arm / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "metrics.json").write_text(json.dumps(_fake_3d_run(arm, seed, ap25)))
    assert T.main(["--report", "--pos", "sine", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "ablation.md").read_text()
    # every arm, in the ablation's order, and every seed (a dash where an arm lacks the seed)
    assert "| seed | (a) none | (b) grid, mask-blind | (c) sine, mask-aware |" in table
    assert "| 0 | - | 0.400 / 0.200 / 0.100 / 0.067 | 0.400 / 0.300 / 0.150 / 0.100 |" in table
    assert "| 2 | - | - | 0.400 / 0.500 / 0.250 / 0.167 |" in table
    assert "| (c) sine, mask-aware | 3 | 0.400 ± 0.000 | 0.400 ± 0.100 |" in table
    assert "| (b) grid, mask-blind | 2 | 0.400 ± 0.000 | 0.325 ± 0.177 |" in table
    assert "| (a) none | 1 | 0.400 | 0.050 |" in table
    # paired over the seeds both arms have: sine - grid on seeds 0 and 1
    assert "| sine - grid | ap25 | +0.100, -0.050 | +0.025 ± 0.106 | 1 / 1 / 0 |" in table
    assert "| sine - none | ap25 | +0.350 | +0.350 ± 0.000 | 1 / 0 / 0 |" in table
    assert "sine vs grid, ap25 (last 3) over seeds [0, 1]" in table and "**the arms are level**" in table
    assert (tmp_path / "curves.png").stat().st_size > 0
    with pytest.raises(SystemExit) as exc:  # nothing to report: argparse's exit 2, naming the flag
        T.main(["--report", "--out", str(tmp_path / "empty")])
    assert exc.value.code == 2


def test_tiny_run_resumes_for_more_steps_and_other_settings_exit_2(tmp_path, capsys):
    """A --tiny run (--train-images, --eval-every and --memory-warmup derived from --steps) resumed
    for more steps keeps its checkpoint's data; other settings end in one line, exit 2."""
    tiny = ["--tiny", "--pos", "sine", "--eval-images", "2", "--threads", "1", "--out", str(tmp_path)]
    threads = torch.get_num_threads()
    try:
        assert run(T.TASK, [*tiny, "--steps", "2", "--save-every", "2"], log=lambda *_: None) == 0
        ckpt = tmp_path / "sine" / "seed0" / "checkpoint.pt"
        first = torch.load(ckpt, weights_only=True)
        assert first["args"]["train_images"] == 2 * first["args"]["batch_size"]
        with pytest.raises(SystemExit) as exc:
            T.main([*tiny, "--steps", "4", "--spacing", "3", "--resume", str(ckpt)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "Traceback" not in err
        assert ("argument --resume: the settings differ from the checkpoint's: --spacing (checkpoint 4.0, given 3.0); "
                "a resumed run keeps every setting of its checkpoint except --device") in err.splitlines()[-1]
        assert run(T.TASK, [*tiny, "--steps", "4", "--resume", str(ckpt)], log=lambda *_: None) == 0
    finally:
        torch.set_num_threads(threads)
    m = json.loads((tmp_path / "sine" / "seed0" / "metrics.json").read_text())
    assert m["steps"] == [1, 2, 3, 4] and m["resumed_at"] == [2] and m["loss"][:2] == first["metrics"]["loss"]
    assert m["args"]["train_images"] == first["args"]["train_images"] and m["args"]["steps"] == 4
