"""The 2D demo's detector on its small ViT (``--backbone vit``): with ``--padding-invariant`` or
``--packed`` each held-out image gets the same class scores and boxes alone as in a padded batch of
the held-out set, for every ``--vit-pos`` arm; the stock ViT does not. And the flags that cannot
work together are refused, one line naming the flag."""

from __future__ import annotations

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("skimage")
pytest.importorskip("scipy")

import vispos  # noqa: E402
from demos import train_detr  # noqa: E402
from vispos.app.train.cli import parse_args  # noqa: E402
from vispos.app.train.engine import build_model  # noqa: E402
from vispos.app.train.task2d import VIT_BASE  # noqa: E402

N_ITEMS = 4


def _model_and_images(tmp_path, flags):
    argv = ["--tiny", "--out", str(tmp_path), "--pos", "sine", "--eval-images", str(N_ITEMS), "--photos", "2",
            "--backbone", "vit", *flags]
    _, args = parse_args(train_detr.TASK, argv)
    _, held = train_detr.TASK.build_datasets(args)
    model = build_model(train_detr.TASK, "sine", args).eval()
    return model, [held[i][0] for i in range(N_ITEMS)]


def _worst_alone_vs_batched(model, images):
    """Largest |alone - in the padded batch of every held-out image| over class probabilities
    and boxes."""
    assert len({im.shape for im in images}) > 1  # the batch is padded
    with torch.no_grad():
        out = model(vispos.nested_tensor_from_tensor_list(images))
        worst = 0.0
        for j, image in enumerate(images):
            one = model(vispos.nested_tensor_from_tensor_list([image]))
            for key, fn in (("pred_logits", lambda t: t.softmax(-1)), ("pred_boxes", lambda t: t)):
                worst = max(worst, float((fn(one[key][0]) - fn(out[key][j])).abs().max()))
    return worst


@pytest.mark.parametrize("vit_pos", ["none", "sincos", "learned", "rope"])
@pytest.mark.parametrize("mode", ["--padding-invariant", "--packed"])
def test_each_image_gets_the_same_predictions_alone_and_in_a_padded_batch(tmp_path, mode, vit_pos):
    model, images = _model_and_images(tmp_path, [mode, "--vit-pos", vit_pos])
    assert model.joiner.backbone.padding_invariant and model.joiner.padding_invariant
    worst = _worst_alone_vs_batched(model, images)
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("vit_pos", ["learned", "rope"])
def test_the_stock_vit_changes_with_the_batch(tmp_path, vit_pos):
    """The same weights without the option: padding tokens are attended to (and the learned table
    is resampled to the canvas), so the predictions change."""
    model, images = _model_and_images(tmp_path, ["--vit-pos", vit_pos])
    assert not model.joiner.backbone.padding_invariant
    assert _worst_alone_vs_batched(model, images) > 1e-3


def test_the_arms_differ_only_in_the_position_signal(tmp_path):
    """Same seed: every weight the arms share starts equal; the sin-cos table is MAE's and frozen,
    the learned one trained; none and rope have no table, rope rotates queries and keys."""
    models = {p: _model_and_images(tmp_path, ["--vit-pos", p])[0] for p in ("none", "sincos", "learned", "rope")}
    vits = {p: m.joiner.backbone.body.model for p, m in models.items()}
    assert type(vits["none"]).__name__ == "Eva" and all(type(v) is type(vits["none"]) for v in vits.values())
    assert vits["none"].pos_embed is None and vits["rope"].pos_embed is None
    assert vits["none"].rope is None and vits["rope"].rope is not None
    shared = dict(models["none"].named_parameters())
    for p, m in models.items():
        for name, value in m.named_parameters():
            if "pos_embed" not in name:
                torch.testing.assert_close(value, shared[name], rtol=0, atol=0, msg=f"{p}: {name}")
    table = vits["sincos"].pos_embed
    assert not table.requires_grad and vits["learned"].pos_embed.requires_grad
    grid = vits["sincos"].patch_embed.grid_size
    torch.testing.assert_close(table[0], vispos.mae_sincos_2d(table.shape[-1], grid, cls_token=True))
    assert table.shape == vits["learned"].pos_embed.shape


def _exit_message(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        train_detr.main(["--tiny", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("argv, message", [
    (["--packed"], "argument --packed: --backbone test_resnet: "),
    (["--backbone", "vit", "--packed", "--padding-invariant"], "argument --packed: is exact per image already"),
    (["--vit-pos", "rope"], "argument --vit-pos: only with --backbone vit"),
    (["--backbone", "vit", "--vit-pos", "alibi"], "argument --vit-pos: invalid choice: 'alibi'"),
    (["--backbone", "vit", "--out-index", "9"], "argument --out-index:"),
    (["--backbone", "vit", "--scales", "4", "48"], "argument --scales: must be >= the ViT's patch (8 px)"),
    (["--vit-patch", "16"], "argument --vit-patch: only with --backbone vit"),
    (["--vit-stem", "conv"], "argument --vit-stem: only with --backbone vit"),
    (["--backbone", "vit", "--vit-patch", "12", "--scales", "48"],
     "argument --vit-patch: must be a power of 2 >= 2 with --vit-stem conv"),
    (["--backbone", "vit", "--vit-patch", "16", "--scales", "12", "48"],
     "argument --scales: must be >= the ViT's patch (16 px)"),
    (["--vit-depth", "6"], "argument --vit-depth: only with --backbone vit"),
    (["--vit-width", "128"], "argument --vit-width: only with --backbone vit"),
    (["--backbone", "vit", "--vit-width", "66"], "argument --vit-width: must be a multiple of the ViT's 4 heads"),
    (["--backbone", "vit", "--vit-width", "4", "--vit-patch", "16"],
     "argument --vit-width: must be a multiple of patch / 2 = 8"),
])
def test_flags_that_cannot_work_are_refused_in_one_line(capsys, tmp_path, argv, message):
    lines = _exit_message(capsys, [*argv, "--out", str(tmp_path)])
    assert any(message in line for line in lines), lines
    if "invalid choice" not in message:  # argparse's own errors come with the usage
        assert len(lines) == 1, lines


def test_the_vit_is_timms_model_with_the_documented_sizes(tmp_path):
    model, _ = _model_and_images(tmp_path, [])
    bb = model.joiner.backbone
    vit = bb.body.model
    assert bb.model_name == VIT_BASE and bb.strides == [8] and bb.num_channels == [64]
    assert len(vit.blocks) == 4
    assert vit.blocks[0].attn.num_heads == 4 and vit.patch_embed.patch_size == (8, 8)
    assert vit.pos_embed is not None and vit.rope is None  # the default arm: learned
    stem = vit.patch_embed.proj  # the default stem: conv (three 3x3 stride-2 convolutions, then a 1x1)
    convs = [m for m in stem.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (3, 16, (3, 3), (2, 2)), (16, 32, (3, 3), (2, 2)), (32, 64, (3, 3), (2, 2)), (64, 64, (1, 1), (1, 1))]


@pytest.mark.parametrize("mode", ["--padding-invariant", "--packed"])
def test_vit_stem_patch_is_vits_patch_projection_and_exact(tmp_path, mode):
    model, images = _model_and_images(tmp_path, ["--vit-stem", "patch", mode])
    proj = model.joiner.backbone.body.model.patch_embed.proj
    assert isinstance(proj, torch.nn.Conv2d) and proj.kernel_size == proj.stride == (8, 8)
    assert _worst_alone_vs_batched(model, images) <= 1e-4


def test_vit_patch_sets_the_patch_and_the_level_stride(tmp_path):
    model, images = _model_and_images(tmp_path, ["--vit-patch", "16", "--padding-invariant"])
    bb = model.joiner.backbone
    assert bb.strides == [16] and bb.body.model.patch_embed.patch_size == (16, 16)
    assert _worst_alone_vs_batched(model, images) <= 1e-4


def test_vit_depth_and_width_size_the_blocks_the_stem_and_the_level(tmp_path):
    model, images = _model_and_images(tmp_path, ["--vit-depth", "2", "--vit-width", "32", "--padding-invariant"])
    bb = model.joiner.backbone
    vit = bb.body.model
    assert len(vit.blocks) == 2 and vit.embed_dim == 32 and bb.num_channels == [32]
    assert bb.out_indices == (1,)  # the last block is the level
    convs = [m for m in vit.patch_embed.proj.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [8, 16, 32, 32]
    assert _worst_alone_vs_batched(model, images) <= 1e-4


@pytest.mark.parametrize("flags, lr, steps, eval_every", [
    ([], 1e-3, 3000, 300),                                              # the CNN keeps DETR-demo's schedule
    (["--backbone", "vit"], 3e-4, 6000, 600),                           # the ViT's own
    (["--backbone", "vit", "--lr", "1e-3", "--steps", "3000"], 1e-3, 3000, 600),  # given flags win
    (["--backbone", "vit", "--tiny"], 3e-4, 20, 10),                     # --tiny's steps, evaluated half-way
])
def test_vit_training_defaults(flags, lr, steps, eval_every):
    _, args = parse_args(train_detr.TASK, flags)
    assert (args.lr, args.steps, args.eval_every) == (lr, steps, eval_every)
