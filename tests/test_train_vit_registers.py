"""``vispos train --backbone vit --vit-registers N``: the flag reaches timm's ``Eva`` as
``num_reg_tokens``; with registers the invariant ViT gives each image alone what it gives it in a
padded batch (float64, eval and training, outputs and parameter gradients), the packed run equals
the padded invariant one, and the flag is refused where it means nothing, in one line."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("skimage")
pytest.importorskip("scipy")

from item_alone import assert_same_gradients, region  # noqa: E402
from vispos import NestedTensor, nested_tensor_from_tensor_list  # noqa: E402
from vispos.app.train import task2d  # noqa: E402
from vispos.app.train.cli import parse_args  # noqa: E402
from vispos.app.train.engine import build_model  # noqa: E402

#: image sizes, none a multiple of the patch (8); the first is the image under test
SIZES = [(37, 53), (61, 29), (50, 50)]


def _args(tmp_path, *flags):
    _, args = parse_args(task2d.TASK, ["--tiny", "--out", str(tmp_path), "--pos", "sine", "--backbone", "vit", *flags])
    return args


def _backbone(tmp_path, *flags):
    torch.manual_seed(0)
    return task2d.build_backbone(_args(tmp_path, *flags)).double()


def _images(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, *s, generator=g, dtype=torch.float64) for s in SIZES]


def _placed(images, position):
    return [images[(k - position) % len(images)] for k in range(len(images))]


@pytest.mark.parametrize("mode", [[], ["--padding-invariant"], ["--packed"]], ids=["stock", "invariant", "packed"])
def test_the_flag_reaches_the_model(tmp_path, mode):
    args = _args(tmp_path, "--vit-registers", "3", *mode)
    assert args.vit_registers == 3
    vit = build_model(task2d.TASK, "sine", args).joiner.backbone.body.model
    assert vit.reg_token.shape == (1, 3, 64)  # Eva's num_reg_tokens (VisionTransformer calls it reg_tokens)
    assert vit.num_prefix_tokens == 4 and vit.cls_token is not None
    plain = build_model(task2d.TASK, "sine", _args(tmp_path, *mode)).joiner.backbone.body.model
    assert plain.reg_token is None and plain.num_prefix_tokens == 1  # the default: no register


def test_the_sincos_table_has_zero_rows_for_the_class_token_and_registers(tmp_path):
    vit = _backbone(tmp_path, "--vit-registers", "2", "--vit-pos", "sincos").body.model
    table = vit.pos_embed[0]
    assert table.shape[0] == 3 + vit.patch_embed.grid_size[0] * vit.patch_embed.grid_size[1]
    assert not table[:3].any() and table[3:].abs().sum() > 0 and not vit.pos_embed.requires_grad


@pytest.mark.parametrize("vit_pos", ["learned", "rope"])
def test_each_image_alone_equals_it_in_a_padded_batch_eval_and_training(tmp_path, vit_pos):
    """``--vit-stem patch`` (a batch-norm stem takes its training statistics over the batch's valid
    cells: alone and in a batch they differ by design); the default stem is checked in eval."""
    for stem, modes in (("patch", (False, True)), ("conv", (False,))):
        bb = _backbone(tmp_path, "--vit-registers", "2", "--vit-pos", vit_pos, "--vit-stem", stem, "--padding-invariant")
        assert bb.body.model.num_prefix_tokens == 3
        images = _images()
        for train in modes:
            bb.train(train)
            twin = copy.deepcopy(bb)
            alone = twin(NestedTensor(images[0][None], None))[0].tensors
            weight = torch.randn(alone.shape[1:], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            twin.zero_grad()
            (alone[0] * weight).sum().backward()
            assert twin.body.model.reg_token.grad.abs().sum() > 0  # the registers take part
            for position in range(len(images)):
                bb.zero_grad()
                level = bb(nested_tensor_from_tensor_list(_placed(images, position)))[0]
                got = level.tensors[(position, slice(None), *region((0, 0), alone.shape[2:]))]
                torch.testing.assert_close(got, alone[0].detach(), rtol=1e-12, atol=1e-12)
                (got * weight).sum().backward()
                assert_same_gradients(bb, twin)


def test_the_stock_vit_with_registers_still_reads_the_padding(tmp_path):
    bb = _backbone(tmp_path, "--vit-registers", "2").eval()
    images = _images()
    with torch.no_grad():
        alone = bb(NestedTensor(images[0][None], None))[0].tensors
        level = bb(nested_tensor_from_tensor_list(images))[0].tensors
    assert (level[(0, slice(None), *region((0, 0), alone.shape[2:]))] - alone[0]).abs().max() > 1e-3


@pytest.mark.parametrize("stem", ["conv", "patch"])
def test_packed_equals_padded_invariant_with_registers(tmp_path, stem):
    invariant = _backbone(tmp_path, "--vit-registers", "2", "--vit-pos", "rope", "--vit-stem", stem,
                          "--padding-invariant")
    packed = _backbone(tmp_path, "--vit-registers", "2", "--vit-pos", "rope", "--vit-stem", stem, "--packed")
    batch = nested_tensor_from_tensor_list(_images(2))
    for train in (False, True):
        invariant.train(train), packed.train(train)
        packed.load_state_dict(invariant.state_dict())  # batch-norm running statistics too
        invariant.zero_grad(), packed.zero_grad()
        want, got = invariant(batch)[0], packed(batch)[0]
        assert got.padding == want.padding
        torch.testing.assert_close(got.tensors, want.tensors, rtol=1e-12, atol=1e-12)
        weight = torch.randn(want.tensors.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        (want.tensors * weight).sum().backward()
        (got.tensors * weight).sum().backward()
        assert_same_gradients(packed, invariant)
        assert packed.body.model.reg_token.grad.abs().sum() > 0


@pytest.mark.parametrize("argv, message", [
    (["--vit-registers", "2"], "argument --vit-registers: only with --backbone vit"),
    (["--backbone", "vit", "--vit-registers", "65"], "argument --vit-registers: must be <= 64, got 65"),
    (["--backbone", "vit", "--vit-registers", "-1"], "argument --vit-registers:"),
])
def test_the_flag_is_refused_in_one_line(capsys, tmp_path, argv, message):
    with pytest.raises(SystemExit) as exc:
        task2d.main(["--tiny", "--out", str(tmp_path), *argv])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_the_help_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        task2d.main(["--help"])
    assert "--vit-registers N" in capsys.readouterr().out
