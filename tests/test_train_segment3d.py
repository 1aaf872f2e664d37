"""vispos train --volume --task segment: the data (sizes, spacings, masks, held-out volumes fixed
per seed), the loss on each volume's own voxels, the batch compositions, every pipeline run from
an empty folder, the invariant pipeline's logits equal across compositions (and the stock one's
not), resumption, the report, the figure and bad flags."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.testing import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("monai")
pytest.importorskip("nilearn")

from vispos.app._train_args import parse_train_args  # noqa: E402
from vispos.app.train import segment3d as S  # noqa: E402
from vispos.app.train.segment3d_args import PIPELINES, SIZE_MULTIPLE, parse_segment_flags  # noqa: E402
from vispos.app.train.segment3d_data import LesionMasks  # noqa: E402
from vispos.app.train.segment3d_eval import composition_batches, infer, volume_metrics  # noqa: E402

TINY = ["--volume", "--task", "segment", "--tiny", "--threads", "1"]


def _tiny_args(*extra):
    _, args = parse_segment_flags([*TINY, *extra])
    return args


def test_items_keep_their_sizes_spacings_and_masks_and_depend_on_seed_and_index_only():
    common = dict(sizes=(16, 40), spacings=(2.0, 4.0), max_objects=2, min_size=3, max_size=6)
    a = LesionMasks(["mni152_t1", "epi"], 6, 3, **common)
    b = LesionMasks(["mni152_t1", "epi"], 6, 3, **common)
    other = LesionMasks(["mni152_t1", "epi"], 6, 4, **common)
    shapes, spacings = set(), []
    for i in range(6):
        (x, t), (y, u) = a[i], b[i]
        assert_close(x, y, rtol=0, atol=0)
        assert torch.equal(t["label"], u["label"])
        assert x.shape[0] == 1 and x.dtype == torch.float32 and t["label"].shape == x.shape[1:]
        assert all(s % SIZE_MULTIPLE == 0 and 16 <= s <= 40 for s in x.shape[1:])
        assert set(t["label"].unique().tolist()) == {0, 1}  # at least one lesion, binary
        shapes.add(tuple(x.shape[1:]))
        spacings.append(t["spacing"])
    assert len(shapes) > 1  # volumes of different sizes
    assert any(float(s.max() / s.min()) > 1.2 for s in spacings)  # anisotropic
    assert any(not torch.equal(a[i][0], other[i][0]) if a[i][0].shape == other[i][0].shape else True
               for i in range(6))


def test_lesions_differ_from_their_surroundings_by_the_contrast():
    d = LesionMasks(["mni152_t1"], 3, 0, (24, 32), (2.0, 2.0), 1, 6, 6, contrast=(5.0, 5.0))
    for i in range(3):
        x, t = d[i]
        inside = x[0][t["label"] == 1]
        assert inside.numel() > 0 and torch.allclose(inside, inside[0].expand_as(inside))  # one value


def test_loss_reads_each_volumes_own_voxels_only():
    from monai.losses import DiceCELoss

    g = torch.Generator().manual_seed(0)
    labels = [torch.randint(0, 2, (8, 16, 8), generator=g), torch.randint(0, 2, (16, 8, 16), generator=g)]
    logits = torch.randn(2, 2, 16, 16, 16, generator=g, dtype=torch.float64)
    other = logits.clone()
    other[0, :, :, :, 8:] = 1e3  # item 0's padding (its D and W beyond 8)
    other[0, :, 8:] = -7.0
    other[1, :, :, 8:] = 55.0  # item 1's padding
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    want = sum(loss_fn(logits[b:b + 1, :, :l.shape[0], :l.shape[1], :l.shape[2]], l[None, None])
               for b, l in enumerate(labels)) / 2
    assert_close(S._loss(logits, labels, loss_fn), want)
    assert_close(S._loss(other, labels, loss_fn), want)


def test_compositions_cover_every_volume_once_and_pair_with_the_largest():
    sizes = [(8, 8, 8), (16, 16, 16), (8, 16, 8), (24, 8, 8), (8, 8, 16)]
    got = composition_batches(sizes, ["batch1", "batch4", "beside_largest"])
    assert got["batch1"] == [([i], 1) for i in range(5)]
    assert got["batch4"] == [([0, 1, 2, 3], 4), ([4], 1)]
    assert got["beside_largest"] == [([0, 1], 1), ([1, 3], 1), ([2, 1], 1), ([3, 1], 1), ([4, 1], 1)]


def test_volume_metrics_on_hand_made_cases():
    label = torch.zeros(8, 8, 8, dtype=torch.int64)
    label[2:6, 2:6, 2:6] = 1
    perfect = torch.stack([1.0 - label.float(), label.float()])
    dice, hd = volume_metrics(perfect, label, [1.0, 2.0, 3.0])
    assert dice == pytest.approx(1.0) and hd == pytest.approx(0.0)
    shifted = torch.roll(perfect, 1, dims=1)  # one voxel along axis 0 (1 mm)
    dice, hd = volume_metrics(shifted, label, [1.0, 2.0, 3.0])
    assert dice == pytest.approx(2 * 48 / 128) and hd == pytest.approx(1.0)
    dice, hd = volume_metrics(torch.stack([torch.ones(8, 8, 8), torch.zeros(8, 8, 8)]), label, [1.0] * 3)
    assert dice == 0.0 and np.isnan(hd)  # nothing predicted


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("network", ["segresnet", "dynunet"])
def test_invariant_logits_equal_across_compositions_and_stock_ones_not(network, one_thread):
    """Held-out volumes alone, in batches of 4 and beside the largest: the invariant pipeline's
    logits on each volume's voxels agree to 1e-4; the stock network's (same weights) do not."""
    torch.manual_seed(0)
    args = _tiny_args("--network", network, "--eval-images", "5")
    _, held = S.build_datasets(args)
    images = [held[i][0] for i in range(len(held))]
    assert len({tuple(x.shape) for x in images}) > 1
    keys = ["batch1", "batch4", "beside_largest"]
    batches = composition_batches([x.shape[1:] for x in images], keys)
    stock = S.build_network(args)
    with torch.no_grad():  # trained-looking norm affines, so the padding's effect is not hidden
        for m in stock.modules():
            if isinstance(m, (torch.nn.GroupNorm, torch.nn.InstanceNorm3d)) and m.affine:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    for pipeline, equal in (("invariant", True), ("whole", False)):
        model = S.Segmenter(stock, pipeline, args.patch, network).eval()
        logits = {k: infer(model, images, batches[k], torch.device("cpu"))[0] for k in keys}
        worst = max(float((logits[k][i] - logits["batch1"][i]).abs().max()) for k in keys[1:] for i in range(5))
        if equal:
            for k in keys[1:]:
                for i in range(5):
                    assert_close(logits[k][i], logits["batch1"][i], rtol=0, atol=1e-4)
        else:
            assert worst > 1e-2, worst


def _run_cli(cwd, *argv):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vispos.app.cli", "train", *TINY, *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Every pipeline's --tiny run, each from an empty folder, into one output root."""
    root = tmp_path_factory.mktemp("segment3d")
    out = root / "out"
    for pipeline in PIPELINES:
        cwd = root / f"cwd-{pipeline}"
        cwd.mkdir()
        proc = _run_cli(cwd, "--pipeline", pipeline, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        (root / f"{pipeline}.log").write_text(proc.stdout)
    return out


@pytest.mark.slow
def test_tiny_run_ends_like_the_2d_one_and_is_never_replaced(tiny_runs, capsys):
    """The segmentation tiny run ends with the 2D run's summary (the train loss early against late,
    then what a tiny run shows); a second one into the same folder is refused before any work
    (before: nothing said whether the loss fell, and a second run replaced the first)."""
    from vispos.app.train.report import TINY_NOTE

    log = (tiny_runs.parent / "invariant.log").read_text().splitlines()
    assert log[-2].startswith("[invariant] train loss, mean of step 1 -> step 6: "), log
    assert log[-1] == TINY_NOTE.format(steps=6, metric="Dice", compared="pipeline", full_steps=250,
                                       doc="docs/segmentation3d.md")
    run = tiny_runs / "invariant" / "segresnet" / "seed0"
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(SystemExit) as info:
        S.run([*TINY, "--pipeline", "invariant", "--out", str(tiny_runs)], log=lambda *_: None)
    assert info.value.code == 2
    assert "holds a finished run, never replaced unless asked" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_figure_legend_names_the_colours_it_draws():
    """Before: the title said "blue outline = ground truth" over an orange outline."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    from vispos.app.figures.segment3d import GROUND_TRUTH, PREDICTION, plot_segmentations

    image = torch.rand(8, 10, 12, generator=torch.Generator().manual_seed(0))
    label = torch.zeros(8, 10, 12, dtype=torch.uint8)
    label[2:6, 3:7, 4:9] = 1
    fig = plot_segmentations(image, label, {"whole": label.roll(1, 0), "invariant": label})
    title = fig._suptitle.get_text()
    assert f"{GROUND_TRUTH[1]} outline = ground truth, {PREDICTION[1]} fill = prediction" in title

    def nearest(rgba) -> str:  # the colour's common name
        names = ("blue", "orange", "yellow", "red", "green", "purple")
        return min(names, key=lambda n: float(np.sum((np.asarray(to_rgba(n)) - np.asarray(rgba)) ** 2)))

    for ax in fig.axes:  # every row outlines the ground truth in the colour the title names
        assert [nearest(c.get_edgecolor()[0]) for c in ax.collections] == [GROUND_TRUTH[1]]
    fills = [im for ax in fig.axes for im in ax.images if im.get_cmap().name == PREDICTION[0]]
    assert len(fills) == 6 and nearest(colormaps[PREDICTION[0]](1.0)) == PREDICTION[1]


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_tiny_run_from_an_empty_folder_writes_its_metrics(tiny_runs, pipeline):
    run = tiny_runs / pipeline / "segresnet" / "seed0"
    m = json.loads((run / "metrics.json").read_text())
    assert m["task"] == "segment3d" and m["pipeline"] == pipeline and m["arm"] == "segresnet"
    assert m["steps"] == list(range(1, 7))
    for key in ("loss", "seconds", "rss_mb", "padded_fraction"):
        assert len(m[key]) == 6 and all(np.isfinite(m[key])), key
    keys = ["batch1"] if pipeline == "crop" else ["batch1", "batch4", "beside_largest"]
    assert m["eval_compositions"] == keys and list(m["eval_by_composition"]) == keys
    for key in keys:
        row = m["eval_by_composition"][key][-1]
        assert row["step"] == 6 and 0 <= row["dice"] <= 1 and row["seconds_per_volume"] > 0 and row["peak_mb"] >= 0
        assert len(m["dice_per_volume"][key]) == 4
    if pipeline == "crop":
        assert m["max_logit_diff"] is None and all(p == 0 for p in m["padded_fraction"])  # fixed-size patches
    else:
        assert any(p > 0 for p in m["padded_fraction"])  # batches of whole volumes of different sizes
        assert len(m["max_logit_diff_per_volume"]) == 4
        if pipeline == "invariant":
            assert m["max_logit_diff"] <= 1e-4
    pred = torch.load(run / "prediction.pt", weights_only=True)
    assert pred["prediction"].shape == pred["label"].shape == pred["image"].shape
    assert list(pred["image"].shape) == m["heldout_sizes"][0]


@pytest.mark.slow
def test_report_tabulates_every_pipeline_and_the_figure_is_drawn(tiny_runs):
    from vispos.app.train.compare import compare_backbones

    lines = []
    assert S.run([*TINY, "--report", "--out", str(tiny_runs)], log=lines.append) == 0
    table = (tiny_runs / "segment3d.md").read_text()
    for pipeline in PIPELINES:
        assert f"| {pipeline} | segresnet | 0 |" in table
    assert "| Dice batch1 | Dice batch4 | Dice beside_largest |" in table
    text = compare_backbones(str(tiny_runs / "whole"), str(tiny_runs / "invariant"), "dice", ("whole", "invariant"))
    assert "| segresnet | 0 |" in text
    assert S.run([*TINY, "--figure", "--out", str(tiny_runs)], log=lines.append) == 0
    from PIL import Image

    with Image.open(tiny_runs / "segment3d_seed0.png") as im:
        assert im.size[0] > 300 and im.size[1] > 600  # 4 rows: truth and three pipelines


@pytest.mark.slow
def test_anysize_unetr_arm_is_exact_across_compositions(tmp_path):
    assert S.run([*TINY, "--pipeline", "invariant", "--network", "unetr", "--unetr-pos", "sincos", "--steps", "2",
                  "--out", str(tmp_path)], log=lambda *_: None) == 0
    m = json.loads((tmp_path / "invariant-sincos" / "unetr" / "seed0" / "metrics.json").read_text())
    assert m["arm"] == "unetr" and m["max_logit_diff"] <= 1e-4


@pytest.mark.slow
def test_resumed_run_continues_the_uninterrupted_one_and_other_settings_exit_2(tmp_path, capsys):
    import shutil

    whole = [*TINY, "--pipeline", "whole", "--eval-every", "100", "--steps", "4"]
    run_a = tmp_path / "a" / "whole" / "segresnet" / "seed0"
    ckpt = tmp_path / "step2.pt"

    def keep_step2(step, model):  # the checkpoint written at step 2, before step 4 overwrites it
        if step == 3:
            shutil.copy(run_a / "checkpoint.pt", ckpt)

    assert S.run([*whole, "--save-every", "2", "--out", str(tmp_path / "a")], log=lambda *_: None,
                 on_step=keep_step2) == 0
    assert S.run([*whole, "--resume", str(ckpt), "--out", str(tmp_path / "b")], log=lambda *_: None) == 0
    a = json.loads((run_a / "metrics.json").read_text())
    b = json.loads((tmp_path / "b" / "whole" / "segresnet" / "seed0" / "metrics.json").read_text())
    assert b["resumed_at"] == [2] and b["steps"] == [1, 2, 3, 4] and a["resumed_at"] == []
    assert_close(torch.tensor(b["loss"]), torch.tensor(a["loss"]), rtol=1e-5, atol=1e-6)
    assert_close(torch.tensor(b["dice_per_volume"]["batch4"]), torch.tensor(a["dice_per_volume"]["batch4"]))
    with pytest.raises(SystemExit) as exc:
        S.run([*whole, "--steps", "4", "--sizes", "16", "16", "--resume", str(ckpt), "--out", str(tmp_path / "b")])
    assert exc.value.code == 2 and "argument --resume:" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--pipeline", "whole", "--network", "unetr"], "--network"),
    (["--network", "unetr", "--unetr-hidden", "32"], "--unetr-hidden"),
    (["--sizes", "64", "32"], "--sizes"),
    (["--sizes", "17", "23"], "--sizes"),
    (["--pipeline", "crop", "--patch", "12"], "--patch"),
    (["--pipeline", "crop", "--sizes", "16", "24", "--patch", "32"], "--patch"),
    (["--max-object", "40"], "--max-object"),
    (["--spacings", "4", "2"], "--spacings"),
    (["--pipeline", "bogus"], "--pipeline"),
    (["--report", "--figure"], "--figure"),
    (["--heldout-volumes", "epi"], "--heldout-volumes"),
    (["--volumes", "nowhere"], "--volumes"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_train_args([*TINY, *argv])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_segment_needs_volume_and_detection_still_parses():
    with pytest.raises(SystemExit) as exc:
        parse_train_args(["--task", "segment", "--tiny"])
    assert exc.value.code == 2
    args = parse_train_args(["--volume", "--task", "detect", "--tiny"])
    assert args.task == "detect" and args.volume and hasattr(args, "queries")
    args = parse_train_args(["--volume", "--task", "segment", "--tiny"])
    assert args.pipeline == "invariant" and args.network == "segresnet" and args.steps == 6


@pytest.mark.slow
def test_torchrun_two_processes_of_one_volume_match_one_process_of_two(tiny_runs, tmp_path):
    """The invariant pipeline under ``torchrun --nproc_per_node 2`` (gloo), one volume per process:
    the same losses as the one-process run with batches of two (each volume's loss is its own and
    DistributedDataParallel averages the gradients as the batch's mean does)."""
    import shutil

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not found")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([torchrun, "--nproc_per_node", "2", "-m", "vispos.app.train.segment3d", *TINY,
                           "--pipeline", "invariant", "--batch-size", "1", "--out", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((tmp_path / "invariant" / "segresnet" / "seed0" / "metrics.json").read_text())
    one = json.loads((tiny_runs / "invariant" / "segresnet" / "seed0" / "metrics.json").read_text())
    assert two["world_size"] == 2 and two["global_batch"] == one["global_batch"] == 2
    assert_close(torch.tensor(two["loss"]), torch.tensor(one["loss"]), rtol=1e-4, atol=1e-5)
    assert two["max_logit_diff"] <= 1e-4


def test_hd95_without_a_prediction_is_left_out_of_the_summary_and_compare():
    """HD95 is None at an evaluation where no volume had a prediction: the summary skips it (and
    drops the metric where every evaluation has None), so compare reads the seeds that have one."""
    from vispos.app.train.compare import _values
    from vispos.app.train.report import summarize_compositions

    def run(hds):
        evals = [{"step": 50 * (i + 1), "dice": 0.1 * (i + 1), "hd95": h} for i, h in enumerate(hds)]
        return {"eval_compositions": ["batch1"], "eval_by_composition": {"batch1": evals}}

    got = summarize_compositions(run([None, 4.0, 6.0]), ["dice", "hd95"])["batch1"]
    assert got["hd95"] == 6.0 and got["hd95_last3"] == 5.0 and got["dice_last3"] == pytest.approx(0.2)
    assert "hd95" not in summarize_compositions(run([None, None]), ["hd95"])["batch1"]
    vals = _values({"segresnet": {0: run([None]), 1: run([3.0])}}, "hd95")
    assert vals == {"segresnet": {0: {}, 1: {"batch1": 3.0}}}
