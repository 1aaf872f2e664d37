"""Every demo's main() runs on tiny input and writes its figure."""

import os
import sys

import pytest
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from demos import grid_encoders_2d, grid_encoders_3d  # noqa: E402


@pytest.mark.parametrize(
    "demo, argv",
    [
        (grid_encoders_2d, ["--max-size", "48", "--channels", "24"]),
        (grid_encoders_3d, ["--max-size", "24", "--num-pos-feats", "8"]),
    ],
)
def test_demo_main(tmp_path, capsys, demo, argv):
    out = tmp_path / "fig.png"
    assert demo.main([*argv, "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 300


@pytest.mark.slow
def test_gallery_writes_every_figure(tmp_path, capsys):
    from demos import gallery

    assert gallery.main(["--small", "--dpi", "40", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([
        "channels_1d.png", "channels_2d.png", "curves.png", "wavelengths.png", "similarity_2d.png",
        "similarity_3d.png", "padded_batch.png", "normalized_coords.png", "rotary.png", "volume_similarity.png",
        "rope_periods.png", "rope_padding.png", "padding_leak.png",
    ])
    assert capsys.readouterr().out.count("wrote ") == len(names)
    for name in names:
        with Image.open(tmp_path / name) as im:
            assert im.format == "PNG" and min(im.size) > 100


def test_monai_volumes_demo(tmp_path, capsys):
    pytest.importorskip("monai")
    from demos import monai_volumes

    png = tmp_path / "volumes.png"
    argv = ["--max-size", "32", "--spacing", "8", "--workers", "0", "--hidden-size", "24", "--out", str(png)]
    assert monai_volumes.main(argv) == 0
    out = capsys.readouterr().out
    assert "batch (3, 1, 32, 32, 32)" in out
    assert "thick slices   scan (25, 29, 9) of 8x8x24 mm" in out
    assert "PositionEmbeddingSine in mm -> (3, 96, 32, 32, 32)" in out
    assert "prediction on the scan's own grid: (25, 29, 9)" in out
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 300
