"""Figures of vision RoPE (vispos/app/figures/vision_rope.py) and their `vispos plot` kinds."""

import math

import pytest
import torch
from PIL import Image
from torch.testing import assert_close

import vispos
from vispos.app import figures
from vispos.app.cli import main


def _mask():
    mask = torch.ones(2, 6, 8, dtype=torch.bool)
    mask[0] = False
    mask[1, 1:5, 2:7] = False
    return mask


def test_rope_grid_is_the_table_channels_first():
    rope = vispos.DinoV3RotaryEmbedding(8)
    grid = figures.rope_grid(rope, (3, 4))
    assert torch.equal(grid, rope.get_embed([3, 4]).T.reshape(16, 3, 4))
    batch = figures.rope_grid(rope, mask=_mask())
    assert torch.equal(batch[1], rope.get_embed(mask=_mask())[1].T.reshape(16, 6, 8))
    torch.manual_seed(0)
    mixed = vispos.MixedRotaryEmbedding(32, 2, 2).train()
    with torch.no_grad():
        table = mixed.eval().get_embed([3, 4])[1, 0]
    mixed.train()
    assert torch.equal(figures.rope_grid(mixed, (3, 4), block=1, head=0), table.T.reshape(32, 3, 4))
    assert mixed.training  # the figure leaves the module's mode as it was
    with pytest.raises(ValueError, match="shape or a mask"):
        figures.rope_grid(rope)
    with pytest.raises(TypeError, match="DinoV3RotaryEmbedding / MixedRotaryEmbedding"):
        figures.rope_grid(vispos.RotaryEmbedding(8), (3, 4))


def test_rope_periods_in_cells():
    dino = vispos.DinoV3RotaryEmbedding(16)  # q = 4, base 100
    assert_close(figures.rope_periods(dino, (10, 20)), 100.0 ** (torch.arange(4) / 4) * torch.tensor([[5.0], [10.0]]))
    xy = vispos.DinoV3RotaryEmbedding(16, grid_indexing="xy", normalize_coords="max")
    assert_close(figures.rope_periods(xy, (10, 20)), (100.0 ** (torch.arange(4) / 4) * 10).expand(2, 4))
    torch.manual_seed(0)
    mixed = vispos.MixedRotaryEmbedding(32, 2, 2)
    periods = figures.rope_periods(mixed, (4, 4))
    assert_close(periods, 2 * math.pi / mixed.freqs.detach().norm(dim=0))
    # at initialisation every head has the paper's magnitudes 1 / 10^(4l / 16), in both groups
    assert_close(periods[0, 0], (2 * math.pi * 10.0 ** (torch.arange(0, 16, 4) / 16)).repeat(2))
    axial = vispos.AxialRotaryEmbedding(16, theta=100.0)
    assert_close(figures.rope_periods(axial, (4, 4))[0], 2 * math.pi * 100.0 ** (torch.arange(0, 8, 2) / 8))
    with pytest.raises(TypeError, match="rope must be"):
        figures.rope_periods(torch.nn.Linear(2, 2), (4, 4))


def test_plot_rope_periods():
    fig = figures.plot_rope_periods(figures.rope_variants(16), (12, 20))
    assert len(fig.axes) == 2
    fig = figures.plot_rope_periods({"dino": vispos.DinoV3RotaryEmbedding(16)}, (8, 8))
    assert len(fig.axes) == 1
    with pytest.raises(ValueError, match="at least one"):
        figures.plot_rope_periods({})
    with pytest.raises(ValueError, match="2 positive ints"):
        figures.plot_rope_periods({"d": vispos.DinoV3RotaryEmbedding(16)}, (8, 8, 8))
    with pytest.raises(ValueError, match="multiple of 4"):
        figures.rope_variants(6)


def test_plot_rope_padding_titles_report_the_difference_from_each_item_alone():
    fig = figures.plot_rope_padding(vispos.DinoV3RotaryEmbedding(16), _mask(), names=["big", "small"])
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 2 * 3 + 1  # the colorbar
    aware = [t for t in titles if t.startswith("get_embed(mask")]
    blind = [t for t in titles if t.startswith("canvas table")]
    assert aware == ["get_embed(mask=...)\ntable vs alone: max |diff| 0"] * 2
    assert blind[0].endswith("max |diff| 0") and not blind[1].endswith("max |diff| 0")
    torch.manual_seed(0)
    figures.plot_rope_padding(vispos.MixedRotaryEmbedding(32, 2, 2), _mask(), block=1, head=1)
    with pytest.raises(ValueError, match=r"\(B, H, W\)"):
        figures.plot_rope_padding(vispos.DinoV3RotaryEmbedding(24, num_axes=3), torch.zeros(1, 2, 3, 4, dtype=torch.bool))
    empty = _mask()
    empty[1] = True
    with pytest.raises(ValueError, match="item 1 has no valid cell"):
        figures.plot_rope_padding(vispos.DinoV3RotaryEmbedding(16), empty)
    with pytest.raises(TypeError, match="bool"):
        figures.plot_rope_padding(vispos.DinoV3RotaryEmbedding(16), _mask().float())


@pytest.mark.parametrize("argv", [
    ["rope", "--samples", "astronaut", "chelsea", "--max-size", "64", "--stride", "8", "--kw", "dim=16"],
    ["rope", "--samples", "astronaut", "coffee", "--max-size", "64", "--stride", "8", "--pad", "symmetric",
     "--encoder", "MixedRotaryEmbedding", "--kw", "dim=32", "depth=2", "num_heads=2"],
    ["rope-periods", "--shape", "14", "14"],
])
def test_cli_plot_rope_kinds(tmp_path, capsys, argv):
    out = tmp_path / "rope.png"
    assert main(["plot", *argv, "--dpi", "40", "--out", str(out)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    with Image.open(out) as im:
        assert im.format == "PNG" and min(im.size) > 100


@pytest.mark.parametrize("argv, match", [
    (["plot", "rope", "--encoder", "RotaryEmbedding", "--kw", "dim=8"], "rope draws a 2D DinoV3RotaryEmbedding"),
    (["plot", "rope", "--kw", "dim=24", "num_axes=3"], "rope draws a 2D"),
    (["plot", "rope", "--stride", "0"], "--stride must be from 1 to 1024, got 0"),
])
def test_cli_plot_rope_errors(tmp_path, capsys, monkeypatch, argv, match):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vispos plot: error: ") and match in err
    assert list(tmp_path.iterdir()) == []
