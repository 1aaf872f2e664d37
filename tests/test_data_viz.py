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


# ------------------------------------------------------------------------------------ volumes
def test_mni152_template_offline():
    from vispos.data import mni152_template

    vol = mni152_template(normalize=None)
    assert vol.shape == (1, 197, 233, 189) and vol.dtype == torch.float32
    assert float(vol.min()) == 0.0 and float(vol.max()) <= 1.0 + 1e-6
    small = mni152_template(resolution=2, max_size=40)
    assert max(small.shape[1:]) == 40
    fg = small[0][mni152_template(resolution=2, normalize=None, max_size=40)[0] != 0]
    torch.testing.assert_close(fg.mean(), torch.tensor(0.0), atol=1e-4, rtol=0)
    torch.testing.assert_close(fg.std(), torch.tensor(1.0), atol=1e-3, rtol=0)


def test_sample_volumes_shapes():
    from vispos.data import sample_volumes

    vols = dict(sample_volumes(max_size=32, normalize="percentile"))
    assert list(vols) == ["mni152", "mni152_coarse", "mni152_superior"]
    shapes = {k: tuple(v.shape) for k, v in vols.items()}
    assert shapes["mni152"][2] == 32 and len(set(shapes.values())) == 3
    for v in vols.values():
        assert float(v.min()) == 0.0 and float(v.max()) == 1.0
    with pytest.raises(ValueError, match="max_size must be an int >= 8"):
        sample_volumes(max_size=4)


def test_normalize_intensity():
    from vispos.data import normalize_intensity

    vol = torch.zeros(2, 4, 4, 4)
    vol[0, 1:3, 1:3, 1:3] = torch.arange(8.0).reshape(2, 2, 2) + 10
    vol[1] = torch.linspace(-5, 5, 64).reshape(4, 4, 4)
    before = vol.clone()
    z = normalize_intensity(vol, "zscore")
    fg = z[0][vol[0] != 0]
    torch.testing.assert_close(fg.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(fg.std(), torch.tensor(1.0))
    mm = normalize_intensity(vol, "minmax")
    assert float(mm[1].min()) == 0.0 and float(mm[1].max()) == 1.0
    pc = normalize_intensity(vol, "percentile", percentiles=(10, 90))
    assert float(pc[1].min()) == 0.0 and float(pc[1].max()) == 1.0 and float((pc[1] == 1).float().mean()) > 0.05
    assert torch.equal(vol, before)  # input untouched
    assert torch.equal(normalize_intensity(vol.double(), None), vol)
    with pytest.raises(ValueError, match="normalize must be one of"):
        normalize_intensity(vol, "robust")
    with pytest.raises(ValueError, match=r"Tensor\[C, D, H, W\]"):
        normalize_intensity(vol[0], "zscore")


def test_load_nifti_round_trip(tmp_path):
    import nibabel as nib
    import numpy as np

    from vispos.data import load_volume, load_volumes, resize_volume

    arr = np.random.default_rng(0).random((6, 8, 10)).astype(np.float32)
    nib.save(nib.Nifti1Image(arr, np.diag([2.0, 2.0, 2.0, 1.0])), tmp_path / "a.nii.gz")
    vol = load_volume(tmp_path / "a.nii.gz", normalize=None)
    assert vol.shape == (1, 6, 8, 10)
    torch.testing.assert_close(vol[0], torch.from_numpy(arr))
    # an LPS-oriented file is reoriented to RAS+
    flipped = np.diag([-2.0, -2.0, 2.0, 1.0])
    nib.save(nib.Nifti1Image(arr, flipped), tmp_path / "lps.nii")
    torch.testing.assert_close(load_volume(tmp_path / "lps.nii", normalize=None)[0], torch.from_numpy(arr[::-1, ::-1].copy()))
    four = np.stack([arr, 2 * arr], -1)
    nib.save(nib.Nifti1Image(four, np.eye(4)), tmp_path / "four.nii")
    assert load_volume(tmp_path / "four.nii").shape == (2, 6, 8, 10)
    assert load_volume(tmp_path / "a.nii.gz", max_size=5).shape == (1, 3, 4, 5)
    assert len(load_volumes([tmp_path / "a.nii.gz"] * 2, progress=False)) == 2
    assert resize_volume(vol, max_size=20).shape == vol.shape  # never enlarges
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_volume(tmp_path / "missing.nii")
    (tmp_path / "junk.nii").write_text("not a volume")
    with pytest.raises(ValueError, match="could not be read as a NIfTI volume"):
        load_volume(tmp_path / "junk.nii")


def test_plot_volume_similarity(tmp_path):
    from vispos.viz import plot_volume_similarity

    nt = nested_tensor_from_tensor_list([torch.rand(1, 10, 12, 8), torch.rand(1, 6, 12, 10)])
    pe = PositionEmbeddingSine(8, normalize=True)
    path = plot_volume_similarity(nt, [nt], [pe(nt)], tmp_path / "v.png", names=["a", "b"], strides=[1])
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 300
    with pytest.raises(ValueError, match="draws 3D batches"):
        img = nested_tensor_from_tensor_list([torch.rand(3, 8, 8)])
        plot_volume_similarity(img, [img], [pe(img)], tmp_path / "w.png")
