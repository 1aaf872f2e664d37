import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vispos import PositionEmbeddingSine, nested_tensor_from_tensor_list
from vispos.app.data import imagenet_normalize, load_image, load_images, sample_images
from vispos.app.figures import cosine_similarity_map, query_cells
from vispos.app.png import plot_position_similarity


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
    path = plot_position_similarity(nt, [nt], [pe(nt)], tmp_path / "f.png", imagenet_normalized=False, n_queries=2)
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 200
    with pytest.raises(ValueError, match="same length"):
        plot_position_similarity(nt, [nt], [], tmp_path / "g.png")


# ------------------------------------------------------------------------------------ volumes
def test_mni152_template_offline():
    from vispos.app.data import mni152_template

    vol = mni152_template(intensity=None)
    assert vol.shape == (1, 197, 233, 189) and vol.dtype == torch.float32
    assert float(vol.min()) == 0.0 and float(vol.max()) <= 1.0 + 1e-6
    small = mni152_template(resolution=2, max_size=40)
    assert max(small.shape[1:]) == 40
    fg = small[0][mni152_template(resolution=2, intensity=None, max_size=40)[0] != 0]
    torch.testing.assert_close(fg.mean(), torch.tensor(0.0), atol=1e-4, rtol=0)
    torch.testing.assert_close(fg.std(), torch.tensor(1.0), atol=1e-3, rtol=0)


def test_sample_volumes_shapes():
    from vispos.app.data import sample_volumes

    vols = dict(sample_volumes(max_size=32, intensity="percentile"))
    assert list(vols) == ["mni152", "mni152_coarse", "mni152_superior"]
    shapes = {k: tuple(v.shape) for k, v in vols.items()}
    assert shapes["mni152"][2] == 32 and len(set(shapes.values())) == 3
    for v in vols.values():
        assert float(v.min()) == 0.0 and float(v.max()) == 1.0
    with pytest.raises(ValueError, match="max_size must be >= 8"):
        sample_volumes(max_size=4)
    with pytest.raises(ValueError, match=r"max_size must be from 8 to 256 \(the template's longest axis is 233\), got 4096"):
        sample_volumes(max_size=4096)  # careful-user pass: this asked for tens of GB


def test_normalize_intensity():
    from vispos.app.data import normalize_intensity

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
    with pytest.raises(ValueError, match="method must be one of"):
        normalize_intensity(vol, "robust")
    with pytest.raises(ValueError, match=r"Tensor\[C, D, H, W\]"):
        normalize_intensity(vol[0], "zscore")


def _normalize_reference(vol: torch.Tensor, method: str, percentiles=(0.5, 99.5)) -> torch.Tensor:
    """The normalisations written from their formulas in float64 (whose range holds 3e38**2)."""
    out = vol.double().clone()
    for c in range(out.shape[0]):
        chan = out[c]
        fg = chan[chan != 0] if bool((chan != 0).any()) else chan.flatten()
        if method == "zscore":
            chan.sub_(fg.mean()).div_(fg.std())
        else:
            if method == "minmax":
                lo, hi = chan.min(), chan.max()
            else:
                lo, hi = torch.quantile(fg, torch.tensor(percentiles, dtype=torch.float64) / 100)
                chan.clamp_(lo, hi)
            chan.sub_(lo).div_(hi - lo)
    return out


@pytest.mark.parametrize("method", ["zscore", "minmax", "percentile"])
@pytest.mark.parametrize("extreme", [[3.0e38, -3.0e38], [3.4028235e38, 3.4028235e38, 1.0], [-3.4028235e38] * 3, [1e-44, 3e-45]])
def test_normalize_extreme_finite_voxels_stays_finite(method, extreme):
    """Issue 26 item 3: float32 voxels near 3e38 (a flipped byte in a compressed file can give
    them) normalised to NaN: the float32 sums and ``max - min`` overflowed. Now finite, and equal
    to the float64 formula."""
    from vispos.app.data import normalize_intensity

    vol = torch.linspace(-50, 200, 2 * 5 * 4 * 3).reshape(2, 5, 4, 3)
    vol[:, 0] = 0  # background
    vol[0].view(-1)[-len(extreme):] = torch.tensor(extreme)
    got = normalize_intensity(vol, method)
    assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, _normalize_reference(vol, method).float(), rtol=1e-5, atol=1e-5)


def test_load_volume_with_extreme_voxels_is_finite(tmp_path):
    """Item 3 end to end: a NIfTI whose float32 voxels include +-3e38 loads finite with every
    normalisation; NaN / inf voxels become 0 as documented and take no part in the statistics."""
    import nibabel as nib

    from vispos.app.data import load_volume

    arr = np.random.default_rng(1).normal(100, 20, (5, 4, 3)).astype(np.float32)
    arr[0, 0, :2] = [3.0e38, -3.0e38]
    arr[1, 1, 1] = np.nan
    nib.save(nib.Nifti1Image(arr, np.eye(4)), tmp_path / "extreme.nii.gz")
    for method in ("zscore", "minmax", "percentile"):
        vol = load_volume(tmp_path / "extreme.nii.gz", intensity=method)
        assert bool(torch.isfinite(vol).all()), method
        clean = torch.from_numpy(np.nan_to_num(arr, nan=0.0))[None]
        torch.testing.assert_close(vol, _normalize_reference(clean, method).float(), rtol=1e-5, atol=1e-5)


def test_normalize_leaves_non_finite_voxels_out_of_the_statistics():
    from vispos.app.data import normalize_intensity

    vol = torch.arange(1.0, 25.0).reshape(1, 2, 3, 4)
    vol[0, 0, 0, 0] = float("nan")
    vol[0, 1, 2, 3] = float("inf")
    z = normalize_intensity(vol, "zscore")
    finite = vol[torch.isfinite(vol)]
    torch.testing.assert_close(z[torch.isfinite(vol)], ((finite - finite.mean()) / finite.std()))
    assert z[0, 0, 0, 0].isnan() and z[0, 1, 2, 3] == float("inf")


def test_load_volume_reads_nifti_pairs_and_refuses_other_formats(tmp_path):
    """Careful-user pass: a .hdr/.img NIfTI pair opened by its .img was called "corrupt" (its
    voxels start at byte 0 of their own file), and an MGH .mgz "truncated" (it is gzipped);
    pairs now load by either name, and non-NIfTI formats are refused with a conversion hint."""
    import nibabel as nib

    from vispos.app.data import load_volume

    arr = np.random.default_rng(2).random((4, 5, 6)).astype(np.float32)
    nib.save(nib.Nifti1Pair(arr, np.eye(4)), tmp_path / "pair.img")
    for name in ("pair.img", "pair.hdr"):
        torch.testing.assert_close(load_volume(tmp_path / name, intensity=None)[0], torch.from_numpy(arr))
    nib.save(nib.MGHImage(arr, np.eye(4)), tmp_path / "brain.mgz")
    with pytest.raises(ValueError, match=r"brain.mgz' is MGH, not NIfTI; load_volume reads NIfTI-1 / NIfTI-2 .* nib.save"):
        load_volume(tmp_path / "brain.mgz")
    nib.save(nib.AnalyzeImage(arr, np.eye(4)), tmp_path / "old.img")
    with pytest.raises(ValueError, match=r"old.img' is Spm2Analyze, not NIfTI"):
        load_volume(tmp_path / "old.img")
    with pytest.raises(TypeError, match="canonical must be a bool, got 'no'"):
        load_volume(tmp_path / "pair.img", canonical="no")


def test_load_nifti_round_trip(tmp_path):
    import nibabel as nib
    import numpy as np

    from vispos.app.data import load_volume, load_volumes, resize_volume

    arr = np.random.default_rng(0).random((6, 8, 10)).astype(np.float32)
    nib.save(nib.Nifti1Image(arr, np.diag([2.0, 2.0, 2.0, 1.0])), tmp_path / "a.nii.gz")
    vol = load_volume(tmp_path / "a.nii.gz", intensity=None)
    assert vol.shape == (1, 6, 8, 10)
    torch.testing.assert_close(vol[0], torch.from_numpy(arr))
    # an LPS-oriented file is reoriented to RAS+
    flipped = np.diag([-2.0, -2.0, 2.0, 1.0])
    nib.save(nib.Nifti1Image(arr, flipped), tmp_path / "lps.nii")
    torch.testing.assert_close(load_volume(tmp_path / "lps.nii", intensity=None)[0], torch.from_numpy(arr[::-1, ::-1].copy()))
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
    from vispos.app.png import plot_volume_similarity

    nt = nested_tensor_from_tensor_list([torch.rand(1, 10, 12, 8), torch.rand(1, 6, 12, 10)])
    pe = PositionEmbeddingSine(8, normalize=True)
    path = plot_volume_similarity(nt, [nt], [pe(nt)], tmp_path / "v.png", names=["a", "b"], strides=[1])
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 300
    with pytest.raises(ValueError, match="draws 3D batches"):
        img = nested_tensor_from_tensor_list([torch.rand(3, 8, 8)])
        plot_volume_similarity(img, [img], [pe(img)], tmp_path / "w.png")


# --------------------------------------------------------- reading as stored (issue 12, 3-6)
def _bomb_png(path, width, height):
    """A valid PNG header declaring ``width x height`` with almost no data (a few hundred bytes)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))
    return path


def test_plot_writes_with_the_mode_open_gives(tmp_path):
    """Item 3: the figure gets 0666 & ~umask (not mkstemp's 0600), and an old file keeps its mode."""
    import os
    import stat

    nt = nested_tensor_from_tensor_list([torch.rand(3, 16, 16)])
    pe = PositionEmbeddingSine(8, normalize=True)
    old = os.umask(0o022)
    try:
        path = plot_position_similarity(nt, [nt], [pe(nt)], tmp_path / "f.png", n_queries=1)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        os.chmod(path, 0o664)
        plot_position_similarity(nt, [nt], [pe(nt)], tmp_path / "f.png", n_queries=1)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o664
    finally:
        os.umask(old)
    assert os.listdir(tmp_path) == ["f.png"]


def test_16_bit_png_is_read_at_its_depth(tmp_path):
    """Item 4: a 0..65535 gradient reads as value / 65535 (before: 99.6% of pixels were 1.0)."""
    arr = np.linspace(0, 65535, 40 * 70).round().astype(np.uint16).reshape(40, 70)
    Image.fromarray(arr).save(tmp_path / "g16.png")  # grey, mode I;16
    img = load_image(tmp_path / "g16.png")
    assert img.dtype == torch.float32 and img.shape == (3, 40, 70)
    torch.testing.assert_close(img, torch.from_numpy(np.stack([arr] * 3) / 65535).float())


def test_16_bit_rgb_png_is_read_at_its_depth(tmp_path):
    """Item 4, RGB: a 16-bit RGB PNG (Pillow cannot write one: its rows are written here, big
    endian as the PNG specification says) reads as value / 65535 per channel."""
    import struct
    import zlib

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 65536, (9, 11, 3), dtype=np.uint16)
    raw = b"".join(b"\0" + arr[r].astype(">u2").tobytes() for r in range(arr.shape[0]))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    (tmp_path / "rgb16.png").write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 11, 9, 16, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )
    img = load_image(tmp_path / "rgb16.png")
    torch.testing.assert_close(img, torch.from_numpy(arr.transpose(2, 0, 1).astype(np.float64) / 65535).float())


def test_float_tiff_is_read_as_stored(tmp_path):
    """Item 4: a float32 TIFF in [0, 1] keeps its values (before: max 0.0039); values outside
    [0, 1] are clipped with a warning naming the file; NaN is refused."""
    arr = np.linspace(0, 1, 20 * 30, dtype=np.float32).reshape(20, 30)
    Image.fromarray(arr, mode="F").save(tmp_path / "f.tif")
    img = load_image(tmp_path / "f.tif")
    torch.testing.assert_close(img, torch.from_numpy(np.stack([arr] * 3)))
    Image.fromarray(arr * 4 - 1, mode="F").save(tmp_path / "wide.tif")
    with pytest.warns(UserWarning, match=r"wide.tif' holds floats from -1 to 3; .* clips them"):
        wide = load_image(tmp_path / "wide.tif")
    torch.testing.assert_close(wide, torch.from_numpy(np.clip(np.stack([arr * 4 - 1] * 3), 0, 1)))
    arr[3, 4] = np.nan
    Image.fromarray(arr, mode="F").save(tmp_path / "nan.tif")
    with pytest.raises(ValueError, match="nan.tif' holds non-finite values"):
        load_image(tmp_path / "nan.tif")


def test_16_bit_tiff_is_read_at_its_depth(tmp_path):
    arr = np.arange(0, 65535, 1000, dtype=np.uint16)[None].repeat(4, 0)
    Image.fromarray(arr).save(tmp_path / "g16.tif")
    torch.testing.assert_close(load_image(tmp_path / "g16.tif")[0], torch.from_numpy(arr / 65535).float())


@pytest.mark.parametrize("fmt", ["jpg", "tif"])
@pytest.mark.parametrize(
    "orientation, transpose",
    [(1, None), (3, Image.Transpose.ROTATE_180), (6, Image.Transpose.ROTATE_270), (8, Image.Transpose.ROTATE_90)],
)
def test_exif_orientation_is_applied(tmp_path, fmt, orientation, transpose):
    """Item 5: a 20x60 image stored with orientation 6 loads as the 60x20 image viewers show.
    The reference is Pillow's ``transpose`` of the stored pixels (JPEG: of the decoded ones)."""
    rng = np.random.default_rng(orientation)
    stored = Image.fromarray(rng.integers(0, 255, (20, 60, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"o{orientation}.{fmt}"
    stored.save(path, exif=exif.tobytes(), **({"quality": 95} if fmt == "jpg" else {}))
    if fmt == "jpg":  # lossy: the reference rotates the decoded pixels (Pillow leaves them as stored)
        with Image.open(path) as im:
            source = im.convert("RGB")
    else:  # lossless: the pixels written (Pillow's TIFF reader may rotate them itself)
        source = stored
    upright = source if transpose is None else source.transpose(transpose)
    expected = torch.from_numpy(np.asarray(upright).copy()).permute(2, 0, 1).float() / 255
    img = load_image(path)
    assert img.shape == expected.shape == ((3, 20, 60) if orientation in (1, 3) else (3, 60, 20))
    # torchvision's and Pillow's JPEG decoders may differ by a grey level or two
    torch.testing.assert_close(img, expected, atol=3 / 255 if fmt == "jpg" else 0, rtol=0)


_ORIENTATION_FORMATS = ["png", "jpg", "webp", "tif", "avif"]


@pytest.mark.parametrize("fmt", _ORIENTATION_FORMATS)
def test_every_exif_orientation_matches_pillow_exif_transpose(tmp_path, fmt):
    """Issue 26 item 2: a WebP with orientation 6 loaded as (3, 30, 50) while JPEG, PNG and TIFF
    gave (3, 50, 30). Every orientation 1-8 of every format carrying EXIF now gives the pixels of
    Pillow's ``ImageOps.exif_transpose`` (lossy formats: of Pillow's own decode of the file)."""
    from PIL import ImageOps

    from vispos.app.data.images import displayed_size

    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 255, (6, 10, 3), dtype=np.uint8)
    stored = Image.fromarray(np.kron(blocks, np.ones((5, 5, 1), np.uint8)))  # 30x50, blocky
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        path = tmp_path / f"o{orientation}.{fmt}"
        options = {"jpg": {"quality": 95}, "webp": {"lossless": True}, "avif": {"quality": 100}}
        stored.save(path, exif=exif.tobytes(), **options.get(fmt, {}))
        with Image.open(path) as im:
            upright = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        expected = torch.from_numpy(upright.copy()).permute(2, 0, 1).float() / 255
        img = load_image(path)
        want = (3, 30, 50) if orientation <= 4 else (3, 50, 30)
        assert img.shape == expected.shape == want, (fmt, orientation)
        assert displayed_size(path) == want[1:]  # the header-only size the CLI bounds batches with
        # TorchCodec's and Pillow's lossy decoders may differ by a grey level or two
        torch.testing.assert_close(img, expected, atol=3 / 255 if fmt in ("jpg", "avif") else 0, rtol=0)


def _png_cases(tmp_path) -> dict[str, tuple]:
    """Issue 26 item 1's minimal PNGs: (path, pixels Pillow reads from the undamaged file)."""
    import struct
    import zlib

    rng = np.random.default_rng(11)
    rgb = rng.integers(0, 255, (9, 13, 3), dtype=np.uint8)
    variants = {
        "rgb": Image.fromarray(rgb),
        "grey": Image.fromarray(rgb[..., 0]),
        "rgba": Image.fromarray(np.dstack([rgb, rgb[..., :1]])),
        "palette": Image.fromarray(rgb).convert("P"),
        "grey16": Image.fromarray(rgb[..., 0].astype(np.uint16) * 257),
        "interlaced": Image.fromarray(rgb),
    }

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    cases = {}
    for name, im in variants.items():
        buf = __import__("io").BytesIO()
        im.save(buf, "PNG", interlace=name == "interlaced")
        data = buf.getvalue()
        start = data.index(b"IDAT") - 4
        (length,) = struct.unpack(">I", data[start : start + 4])
        head, idat, tail = data[:start], data[start + 8 : start + 8 + length], data[start + 12 + length :]
        raw = bytearray(zlib.decompress(idat))
        raw[0] = 7  # the first row's filter type: 0..4 are defined
        damaged = {
            "empty_idat": head + chunk(b"IDAT", b"") + tail,
            "short_idat": head + chunk(b"IDAT", idat[: len(idat) // 3]) + tail,
            "bad_crc": head + data[start : start + 8 + length] + b"\0\0\0\0" + tail,
            "garbage_idat": head + chunk(b"IDAT", rng.bytes(len(idat))) + tail,
            "filter_7": head + chunk(b"IDAT", zlib.compress(bytes(raw))) + tail,
            "truncated": data[: start + 8 + length // 2],
        }
        for kind, blob in damaged.items():
            path = tmp_path / f"{name}_{kind}.png"
            path.write_bytes(blob)
            cases[f"{name}_{kind}"] = path
    return cases


def test_damaged_pngs_raise_instead_of_ending_the_process(tmp_path):
    """Issue 26 item 1: torchvision's PNG decoder ended the process (SIGSEGV) on PNGs with an
    empty, short or garbage IDAT or a row filter of 7, in every colour type. Read in a child
    process (a crash must not take pytest down): each raises ValueError naming the file, a bad
    CRC alone too (TorchCodec calls it damaged; issue 32 item 7: no second decoder)."""
    import json
    import subprocess
    import sys

    cases = _png_cases(tmp_path)
    code = (
        "import json, sys\n"
        "from vispos.app.data import load_image\n"
        "out = {}\n"
        "for name, path in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        out[name] = ['ok', load_image(path).mul(255).round().int().tolist()]\n"
        "    except Exception as exc:\n"
        "        out[name] = [type(exc).__name__, str(exc)]\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps({k: str(v) for k, v in cases.items()})],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-500:]}"
    results = json.loads(done.stdout)
    for name, (status, value) in results.items():
        assert status == "ValueError", (name, status, value)
        assert f"{cases[name]}' could not be read as an image" in value, value


def _palette_photo():
    rng = np.random.default_rng(32)
    return Image.fromarray(rng.integers(30, 255, (24, 32, 3), dtype=np.uint8)).convert("P")


def _encoded(im, fmt, **options):
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


def _damaged_palette_files():
    """Palette PNGs and GIFs written by Pillow, then damaged: ``{name: (bytes, pillow_lenient)}``,
    where ``pillow_lenient`` is the ``ImageFile.LOAD_TRUNCATED_IMAGES`` under which Pillow alone
    returns an image for the file without any error."""
    png, gif = _encoded(_palette_photo(), "PNG"), _encoded(_palette_photo(), "GIF")
    plte = png.index(b"PLTE") - 4
    (plte_len,) = struct.unpack(">I", png[plte : plte + 4])
    flags = gif[10]
    pos = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)  # after the global colour table
    while gif[pos] == 0x21:  # extensions before the image
        pos += 2
        while gif[pos]:
            pos += gif[pos] + 1
        pos += 1
    assert gif[pos] == 0x2C
    lzw_min0 = bytearray(gif)
    lzw_min0[pos + 10] = 0  # the LZW minimum code size: 2..8 for an 8-bit palette
    return {
        "palette_truncated.png": (png[: len(png) // 2], True),  # cut inside IDAT: rows filled black
        "gif_truncated.gif": (gif[: len(gif) // 2], True),
        "palette_no_plte.png": (png[:plte] + png[plte + 12 + plte_len :], False),  # all black
        "palette_cut_in_crc.png": (png[:-14], False),  # the end marker and half the last CRC gone
        "gif_lzw_min0.gif": (bytes(lzw_min0), False),  # wrong pixels
        "gif_no_trailer.gif": (gif[:-1], False),
    }


@pytest.mark.parametrize("name", list(_damaged_palette_files()))
def test_a_file_torchcodec_refuses_is_not_guessed_by_pillow(tmp_path, monkeypatch, name):
    """Issue 32 item 7: Pillow, tried after TorchCodec refused a file, returned a plausible image
    for damaged palette PNGs and GIFs (all black for a lost palette or a truncation under
    LOAD_TRUNCATED_IMAGES). Each damaged file here is one Pillow alone reads without an error;
    load_image refuses it, naming the file and TorchCodec's reason."""
    from PIL import ImageFile

    data, lenient = _damaged_palette_files()[name]
    path = tmp_path / name
    path.write_bytes(data)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", lenient)
    with Image.open(path) as im:
        im.load()  # the trap: Pillow raises nothing
        assert im.size == (32, 24)
    with pytest.raises(ValueError, match=(
        rf"image file '{path}' could not be read as an image \(damaged or truncated\?\): TorchCodec: "
        rf"RuntimeError: .*; not retried with Pillow, which returns plausible but wrong pixels for some "
        rf"damaged (PNG|GIF) files"
    )):
        load_image(path)


def test_palette_truncation_under_lenient_pillow_was_a_black_image(tmp_path, monkeypatch):
    """What the fallback returned: a truncated palette PNG comes out of Pillow mostly black."""
    from PIL import ImageFile

    data, _ = _damaged_palette_files()["palette_truncated.png"]
    (tmp_path / "a.png").write_bytes(data)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with Image.open(tmp_path / "a.png") as im:
        black = (np.asarray(im.convert("RGB")) == 0).all(-1).mean()
    assert black > 0.4
    with pytest.raises(ValueError, match="not retried with Pillow"):
        load_image(tmp_path / "a.png")


@pytest.mark.parametrize("fmt, options, atol", [
    ("PNG", {}, 0), ("GIF", {}, 0), ("GIF", {"interlace": True, "transparency": 3}, 0),
    ("WEBP", {"lossless": True}, 0), ("JPEG", {"quality": 90}, 2 / 255), ("JPEG", {"progressive": True}, 2 / 255),
])
def test_valid_files_of_torchcodec_formats_decode_to_pillows_pixels(tmp_path, fmt, options, atol):
    """The undamaged originals: TorchCodec alone reads them, to Pillow's pixels (JPEG: both
    libjpeg, within 2 levels)."""
    im = _palette_photo() if fmt in ("PNG", "GIF") else _palette_photo().convert("RGB")
    path = tmp_path / f"a.{fmt.lower()}"
    path.write_bytes(_encoded(im, fmt, **options))
    with Image.open(path) as decoded:
        expected = torch.from_numpy(np.asarray(decoded.convert("RGB")).copy()).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(load_image(path), expected, atol=atol, rtol=0)


def test_no_torchvision_io_decoding_left():
    """Issue 26 item 1: torchvision's image decoders are deprecated (pytorch/vision #9609) and
    crashed on damaged PNGs; neither the library nor the demos use them, and TorchCodec is a
    requirement."""
    import configparser

    root = Path(__file__).resolve().parents[1]
    users = [
        str(p.relative_to(root)) for folder in ("vispos", "demos") for p in (root / folder).rglob("*.py")
        if "torchvision.io" in p.read_text()
    ]
    assert users == []
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    assert "torchcodec>=0.17" in cfg["options"]["install_requires"].split()


def test_formats_outside_the_list_are_refused_by_name(tmp_path):
    from vispos.app.data import IMAGE_FORMATS

    assert IMAGE_FORMATS == ("AVIF", "BMP", "GIF", "JPEG", "MPO", "PNG", "PPM", "TIFF", "WEBP")
    Image.new("RGB", (4, 3)).save(tmp_path / "a.tga")
    with pytest.raises(ValueError, match=r"a.tga' is TGA; load_image reads AVIF, BMP, GIF, JPEG, MPO, PNG, PPM, TIFF, WEBP"):
        load_image(tmp_path / "a.tga")
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(ValueError, match=r"notes.png' could not be read as an image: Pillow identifies no image format in it \(load_image reads AVIF"):
        load_image(tmp_path / "notes.png")


@pytest.mark.parametrize("fmt, options", [("MPO", {}), ("AVIF", {"quality": 100}), ("PPM", {}), ("BMP", {})])
def test_other_accepted_formats_match_pillow(tmp_path, fmt, options):
    rng = np.random.default_rng(3)
    frames = [Image.fromarray(np.kron(rng.integers(0, 255, (4, 6, 3), dtype=np.uint8), np.ones((4, 4, 1), np.uint8)))
              for _ in range(2)]
    path = tmp_path / f"a.{fmt.lower()}"
    if fmt == "MPO":  # a real multi-picture file: two JPEGs, as phone cameras write
        frames[0].save(path, "MPO", save_all=True, append_images=frames[1:])
    else:
        frames[0].save(path, fmt, **options)
    with Image.open(path) as im:
        assert im.format == fmt
        expected = torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(load_image(path), expected, atol=3 / 255, rtol=0)


def test_decompression_bomb_is_refused_from_the_header(tmp_path):
    """Item 6: a ~100-byte PNG declaring 100000x100000 (above Pillow's own limit) and one
    declaring 10000x10000 (above ours) answer ValueError naming the file, the size and the limit."""
    big = _bomb_png(tmp_path / "bomb.png", 100_000, 100_000)
    with pytest.raises(ValueError, match=r"bomb.png' declares 100000x100000 = 10000000000 pixels, more than Pillow's limit"):
        load_image(big)
    medium = _bomb_png(tmp_path / "medium.png", 10_000, 10_000)
    with pytest.raises(ValueError, match=r"medium.png' declares 10000x10000 = 100000000 pixels, more than max_pixels=89478485"):
        load_image(medium)
    with pytest.raises(ValueError, match=r"declares 10000x10000 = 100000000 pixels, more than max_pixels=1000"):
        load_image(medium, max_pixels=1000)
    with pytest.raises(ValueError, match="max_pixels must be a positive int, got 0"):
        load_image(medium, max_pixels=0)


def test_animated_gif_gives_its_first_frame(tmp_path):
    frames = [Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)) for i in range(1, 4)]
    frames[0].save(tmp_path / "a.gif", save_all=True, append_images=frames[1:])
    with Image.open(tmp_path / "a.gif") as im:
        first = torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(load_image(tmp_path / "a.gif"), first)


def _forged_nifti(path, shape, dtype=np.float32, data=b"", vox_offset=352):
    """A NIfTI-1 file written byte by byte: nibabel's header for ``shape`` and ``dtype``,
    followed by ``data`` (which need not match)."""
    import nibabel as nib

    hdr = nib.Nifti1Header()
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(dtype)
    hdr["vox_offset"] = vox_offset  # 352: the voxels follow the header and its 4 extension bytes
    path.write_bytes(hdr.binaryblock + b"\0" * 4 + data)
    return path


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_nifti_header_checks_before_reading(tmp_path, suffix):
    """Item 6: an RGB24 file and a header claiming 4000^3 voxels answer a ValueError naming
    the file and what was found, before any voxel is read (before: numpy's
    DTypePromotionError without the file; a bare MemoryError)."""
    import nibabel as nib

    from vispos.app.data import load_volume

    rgb = np.zeros((4, 5, 6), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    nib.save(nib.Nifti1Image(rgb, np.eye(4)), tmp_path / f"rgb{suffix}")
    with pytest.raises(ValueError, match=r"rgb.nii(.gz)?' stores RGB voxels .* real scalar voxels"):
        load_volume(tmp_path / f"rgb{suffix}")
    nib.save(nib.Nifti1Image(np.zeros((4, 5, 6), np.complex64), np.eye(4)), tmp_path / f"c{suffix}")
    with pytest.raises(ValueError, match=r"c.nii(.gz)?' stores complex64 voxels"):
        load_volume(tmp_path / f"c{suffix}")
    big = _forged_nifti(tmp_path / "big.nii", (4000, 4000, 4000), data=b"\0" * 64)
    with pytest.raises(ValueError, match=r"big.nii' declares shape \(4000, 4000, 4000\) = 64000000000 voxels, "
                                         r"more than max_voxels=268435456; refused before reading"):
        load_volume(big)
    small = _forged_nifti(tmp_path / "small.nii", (4, 5, 6), data=np.arange(120, dtype=np.float32).tobytes())
    with pytest.raises(ValueError, match=r"declares shape \(4, 5, 6\) = 120 voxels, more than max_voxels=100"):
        load_volume(small, max_voxels=100)
    torch.testing.assert_close(load_volume(small, intensity=None, canonical=False, max_voxels=120)[0],
                               torch.arange(120, dtype=torch.float32).reshape(6, 5, 4).permute(2, 1, 0))


def test_nifti_truncated_empty_and_corrupt_headers(tmp_path):
    import nibabel as nib

    from vispos.app.data import load_volume

    trunc = _forged_nifti(tmp_path / "trunc.nii", (40, 40, 40), data=b"\0" * 100)
    with pytest.raises(ValueError, match=r"trunc.nii' is truncated: its header declares shape \(40, 40, 40\) of "
                                         r"float32 \(256352 bytes with the header\) but .* has 452 bytes"):
        load_volume(trunc)
    inside = _forged_nifti(tmp_path / "inside.nii", (4, 5, 6), data=b"\0" * 480, vox_offset=0)
    with pytest.raises(ValueError, match=r"inside.nii' is corrupt: its voxels would start at byte 0, inside its "
                                         r"348-byte header"):
        load_volume(inside)
    empty = _forged_nifti(tmp_path / "empty.nii", (4, 0, 6))
    with pytest.raises(ValueError, match=r"empty.nii' has an empty axis: its header says shape \(4, 0, 6\)"):
        load_volume(empty)
    nib.save(nib.Nifti1Image(np.zeros((4, 5, 6, 1, 3), np.float32), np.eye(4)), tmp_path / "five.nii")
    with pytest.raises(ValueError, match=r"five.nii' must be 3-D or 4-D, got shape \(4, 5, 6, 1, 3\)"):
        load_volume(tmp_path / "five.nii")
    hdr = nib.Nifti1Header()
    hdr.set_data_shape((4, 5, 6))
    hdr["pixdim"][1:4] = np.nan
    hdr["qform_code"] = hdr["sform_code"] = 0
    hdr["vox_offset"] = 352
    (tmp_path / "nan_affine.nii").write_bytes(hdr.binaryblock + b"\0" * 4 + b"\0" * 480)
    with pytest.raises(ValueError, match=r"nan_affine.nii' could not be read as a NIfTI volume: LinAlgError"):
        load_volume(tmp_path / "nan_affine.nii")


def test_loaders_check_progress(tmp_path):
    """Careful-user pass: ``progress="no"`` (truthy) showed the bar."""
    from vispos.app.data import load_volumes

    with pytest.raises(TypeError, match="progress must be a bool or None, got 'no'"):
        load_images([tmp_path / "a.png"], progress="no")
    with pytest.raises(TypeError, match="progress must be a bool or None, got 0"):
        load_volumes([tmp_path / "a.nii"], progress=0)
