"""The demos' detector with --padding-invariant: each held-out image gets the same class scores and
boxes alone as in the demo's padded batches (issue 31 item 2), in 2D and 3D; the stock backbone
does not."""

from __future__ import annotations

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("scipy")

import vispos  # noqa: E402
from demos import train_detr, train_detr3d  # noqa: E402
from vispos.app.train.cli import parse_args  # noqa: E402
from vispos.app.train.engine import build_model  # noqa: E402
from trained_norms import trained_like as _trained_like  # noqa: E402


def _alone_vs_batched(task, flags, tmp_path, n_items=6, batch=3):
    """Largest |alone - batched| over every held-out item's class probabilities and boxes, for the
    stock and the padding-invariant model with the same weights."""
    worst = {}
    for invariant in (False, True):
        argv = ["--tiny", "--out", str(tmp_path), "--pos", "sine", "--eval-images", str(n_items), *flags]
        _, args = parse_args(task, argv + (["--padding-invariant"] if invariant else []))
        _, held = task.build_datasets(args)
        model = build_model(task, "sine", args)
        if not invariant:
            _trained_like(model)
            state = model.state_dict()
        else:
            model.load_state_dict(state)
        model.eval()
        images = [held[i][0] for i in range(n_items)]
        diff = 0.0
        with torch.no_grad():
            for start in range(0, n_items, batch):
                group = images[start:start + batch]
                out = model(vispos.nested_tensor_from_tensor_list(group))
                for j, image in enumerate(group):
                    one = model(vispos.nested_tensor_from_tensor_list([image]))
                    for key, fn in (("pred_logits", lambda t: t.softmax(-1)), ("pred_boxes", lambda t: t)):
                        diff = max(diff, float((fn(one[key][0]) - fn(out[key][j])).abs().max()))
        worst[invariant] = diff
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("task, flags", [
    (train_detr.TASK, ["--photos", "3"]),
    (train_detr3d.TASK, []),
])
def test_each_image_gets_the_same_predictions_alone_and_in_a_padded_batch(task, flags, tmp_path):
    worst = _alone_vs_batched(task, flags, tmp_path)
    print(f"{task.name}: largest |alone - batched| stock {worst[False]:.3g}, invariant {worst[True]:.3g}")
    assert worst[True] < 1e-4, worst
    assert worst[False] > 1e-3, worst  # the leak the option removes


def test_flag_refused_with_sync_norm(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(train_detr.TASK, ["--tiny", "--out", str(tmp_path), "--padding-invariant", "--norm", "sync"])
    assert exc.value.code == 2
    assert "argument --padding-invariant: does not work with --norm sync" in capsys.readouterr().err
