import numpy as np
import pytest
import torch
from PIL import Image

from vispos import PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos.data import imagenet_normalize, load_image, load_images, sample_images
from vispos.viz import cosine_similarity_map, plot_position_similarity, query_cells


def test_sample_images_shipped_sizes():
    samples = dict(sample_images())
    assert {k: tuple(v.shape) for k, v in samples.items()} == {
        "astronaut": (3, 512, 512), "coffee": (3, 400, 600), "chelsea": (3, 300, 451), "rocket": (3, 427, 640)
    }
    for img in samples.values():
        assert img.dtype == torch.float32 and 0 <= float(img.min()) and float(img.max()) <= 1


def test_load_image_grey_and_resize(tmp_path):
    arr = np.arange(50 * 80, dtype=np.uint8).reshape(50, 80)
    Image.fromarray(arr).save(tmp_path / "g.png")
    img = load_image(tmp_path / "g.png")
    assert img.shape == (3, 50, 80)
    torch.testing.assert_close(img[0], torch.from_numpy(arr).float() / 255)
    assert load_image(tmp_path / "g.png", max_size=40).shape == (3, 25, 40)
    assert len(load_images([tmp_path / "g.png"] * 2, progress=False)) == 2
    with pytest.raises(ValueError, match="max_size"):
        load_image(tmp_path / "g.png", max_size=0)


def test_imagenet_normalize():
    img = torch.rand(3, 4, 5)
    out = imagenet_normalize(img)
    torch.testing.assert_close(out[1], (img[1] - 0.456) / 0.224)
    with pytest.raises(ValueError, match=r"\(3, H, W\)"):
        imagenet_normalize(torch.rand(1, 4, 5))


def test_cosine_similarity_map():
    pos = PositionEmbeddingSine(16, normalize=True)(torch.zeros(1, 1, 6, 7))[0]
    sim = cosine_similarity_map(pos, (2, 3))
    assert sim.shape == (6, 7)
    torch.testing.assert_close(sim[2, 3], torch.tensor(1.0))
    ref = torch.stack([torch.nn.functional.cosine_similarity(pos[:, i, j], pos[:, 2, 3], dim=0) for i in range(6) for j in range(7)])
    torch.testing.assert_close(sim.flatten(), ref)
    with pytest.raises(ValueError, match="query"):
        cosine_similarity_map(pos, (6, 0))
    assert query_cells((10, 20), 3) == [(2, 4), (5, 10), (8, 16)]


def test_plot_writes_png(tmp_path):
    nt = nested_tensor_from_tensor_list([torch.rand(3, 32, 48), torch.rand(3, 40, 24)])
    pe = PositionEmbeddingSine(8, normalize=True)
    path = plot_position_similarity(nt, [nt], [pe(nt)], tmp_path / "f.png", normalized=False, n_queries=2)
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 200
    with pytest.raises(ValueError, match="same length"):
        plot_position_similarity(nt, [nt], [], tmp_path / "g.png")
