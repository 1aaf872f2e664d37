"""vispos.viz figure functions and ``vispos plot``: numbers drawn equal a slow reference, axes
counts, layout sizes, error paths, and the CLI writing a real PNG for every kind."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

import vispos
from vispos.app import figures as viz
from vispos.app.cli import main


def _images(ax):
    return [im.get_array() for im in ax.get_images()]


def _ref_cosine(pos, q):
    """Slow reference: loop over cells, dot / norms in float64."""
    c, *spatial = pos.shape
    p = pos.double()
    qv = p[(slice(None), *q)]
    out = torch.empty(spatial, dtype=torch.float64)
    for idx in np.ndindex(*spatial):
        v = p[(slice(None), *idx)]
        out[idx] = (v @ qv) / (v.norm() * qv.norm())
    return out


def _ref_detr_normalized(mask, scale=2 * math.pi, eps=1e-6, offset=0.0):
    """Slow reference of DETR's normalised coordinates from the formula, cell by cell."""
    b, h, w = mask.shape
    y = torch.zeros(b, h, w, dtype=torch.float64)
    x = torch.zeros(b, h, w, dtype=torch.float64)
    for i in range(b):
        for r in range(h):
            for c in range(w):
                cy = sum(1 for rr in range(r + 1) if not mask[i, rr, c])
                ly = sum(1 for rr in range(h) if not mask[i, rr, c])
                cx = sum(1 for cc in range(c + 1) if not mask[i, r, cc])
                lx = sum(1 for cc in range(w) if not mask[i, r, cc])
                y[i, r, c] = (cy + offset) / (ly + eps) * scale
                x[i, r, c] = (cx + offset) / (lx + eps) * scale
    return y, x


# ------------------------------------------------------------------------------ encode_grid
@pytest.mark.parametrize("shape", [(7,), (5, 6), (3, 4, 5)])
def test_encode_grid_sine_equals_module(shape):
    enc = vispos.PositionEmbeddingSine(8, normalize=True)
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[..., -2:] = True
    got = viz.encode_grid(enc, shape, mask=mask)
    torch.testing.assert_close(got, enc(mask[None])[0])
    assert got.shape == (8 * len(shape), *shape)


def test_encode_grid_layouts_channels_first():
    shape = (4, 6)
    last = viz.encode_grid(vispos.PositionalEncoding2D(10), shape)
    first = viz.encode_grid(vispos.PositionalEncodingPermute2D(10), shape)
    torch.testing.assert_close(last, first)
    torch.testing.assert_close(last, vispos.PositionalEncoding2D(10)(torch.zeros(1, 4, 6, 10))[0].permute(2, 0, 1))
    seq = vispos.SinusoidalPositionalEncoding(12, dropout=0.5, batch_first=False)
    got = viz.encode_grid(seq, (9,))
    assert seq.training  # restored
    ref = vispos.SinusoidalPositionalEncoding(12).eval()(torch.zeros(1, 9, 12))[0].T
    torch.testing.assert_close(got, ref)


def test_encode_grid_errors():
    with pytest.raises(TypeError, match="encoder must be a vispos"):
        viz.encode_grid(torch.nn.Linear(2, 2), (4,))
    with pytest.raises(ValueError, match="encodes 2 spatial axes"):
        viz.encode_grid(vispos.PositionalEncoding2D(8), (4,))
    with pytest.raises(ValueError, match="encodes sequences"):
        viz.encode_grid(vispos.SinusoidalPositionalEncoding(8), (4, 4))
    with pytest.raises(ValueError, match=r"shape must hold 1 or 2 or 3 ints"):
        viz.encode_grid(vispos.PositionEmbeddingSine(8), (2, 2, 2, 2))
    with pytest.raises(TypeError, match="shape must hold ints"):
        viz.encode_grid(vispos.PositionEmbeddingSine(8), (2.0, 3))
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        viz.encode_grid(vispos.PositionEmbeddingSine(8), (4,), mask=torch.zeros(4))
    with pytest.raises(ValueError, match=r"mask must have shape \(4,\)"):
        viz.encode_grid(vispos.PositionEmbeddingSine(8), (4,), mask=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(TypeError, match="takes no mask"):
        viz.encode_grid(vispos.PositionalEncoding1D(8), (4,), mask=torch.zeros(4, dtype=torch.bool))


# ------------------------------------------------------------------------------ wavelengths
@pytest.mark.parametrize("temperature", [20, 10000])
def test_channel_wavelengths_is_the_period(temperature):
    """Shifting positions by a channel's wavelength leaves that channel unchanged."""
    enc = vispos.PositionEmbeddingSine(16, temperature=temperature)
    lam = viz.channel_wavelengths(enc, 50)
    ref = torch.tensor([2 * math.pi * temperature ** (2 * (c // 2) / 16) for c in range(16)], dtype=torch.float64)
    torch.testing.assert_close(lam, ref)
    # the encoder's own channels 2k / 2k+1 are sin / cos(2 pi p / lam): lam is their period
    pos = viz.encode_grid(enc, (40,)).double()
    p = torch.arange(1, 41, dtype=torch.float64)
    for c in (0, 3, 6, 15):
        f = torch.sin if c % 2 == 0 else torch.cos
        torch.testing.assert_close(pos[c], f(2 * math.pi * p / lam[c]), atol=2e-5, rtol=0)


def test_channel_wavelengths_normalize_and_split_layout():
    enc = vispos.PositionEmbeddingSine(8, normalize=True)
    lam = viz.channel_wavelengths(enc, 30)
    ref = torch.tensor([2 * math.pi * 10000 ** (2 * (c // 2) / 8) * (30 + 1e-6) / (2 * math.pi) for c in range(8)],
                       dtype=torch.float64)
    torch.testing.assert_close(lam, ref)
    seq = vispos.SinusoidalPositionalEncoding(8, layout="split", ladder="t2t")
    lam = viz.channel_wavelengths(seq, 10)
    ref = torch.tensor([2 * math.pi * math.exp(math.log(10000) * (c % 4) / 3) for c in range(8)], dtype=torch.float64)
    torch.testing.assert_close(lam, ref)
    assert viz.channel_wavelengths(vispos.PositionEmbeddingLearned(8), 10) is None
    # speechain's 'sep' (the continued ladder): cosine k on rung 4 + k; checked on the channels
    for enc, rung in ((vispos.SpeechainPositionalEncoding("sep", 8), lambda c: c),
                      (vispos.SinusoidalPositionalEncoding(8, ladder="continued"), lambda c: c // 2 + 4 * (c % 2))):
        lam = viz.channel_wavelengths(enc, 10)
        ref = torch.tensor([2 * math.pi * 10000 ** (2 * rung(c) / 8) for c in range(8)], dtype=torch.float64)
        torch.testing.assert_close(lam, ref)
        table = viz.encode_grid(enc, (60,))  # channels-first, the period read back from the channels
        p = torch.arange(60.0)
        for c in range(8):
            f = torch.sin if (c < 4 if isinstance(enc, vispos.SpeechainPositionalEncoding) else c % 2 == 0) else torch.cos
            torch.testing.assert_close(table[c], f(2 * math.pi * p / lam[c]).float(), atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="length must be a positive int, got 0"):
        viz.channel_wavelengths(enc, 0)


def test_plot_wavelengths_draws_the_formula():
    fig = viz.plot_wavelengths(16, temperatures=(20, 10000), ladders=("standard", "t2t"))
    assert len(fig.axes) == 2
    std, t2t = fig.axes
    assert len(std.lines) == 2 and len(t2t.lines) == 2
    k = np.arange(8)
    np.testing.assert_allclose(std.lines[0].get_ydata(), 2 * np.pi * 20.0 ** (2 * k / 16), rtol=1e-12)
    np.testing.assert_allclose(t2t.lines[1].get_ydata(), 2 * np.pi * np.exp(np.log(10000.0) * k / 7), rtol=1e-12)
    freq = viz.plot_wavelengths(16, temperatures=(100,), ladders=("standard",), frequency=True)
    np.testing.assert_allclose(freq.axes[0].lines[0].get_ydata(), 100.0 ** (-2 * k / 16), rtol=1e-12)
    cont = viz.plot_wavelengths(16, temperatures=(100,), ladders=("continued",))
    np.testing.assert_allclose(cont.axes[0].lines[0].get_ydata(),
                               2 * np.pi * 100.0 ** (np.concatenate([2 * k, 16 + 2 * k]) / 16), rtol=1e-6)
    with pytest.raises(ValueError, match="ladder must be one of"):
        viz.plot_wavelengths(16, ladders=("log",))
    with pytest.raises(ValueError, match="must be non-empty"):
        viz.plot_wavelengths(16, temperatures=())
    with pytest.raises(ValueError, match="num_feats must be a positive even int"):
        viz.plot_wavelengths(15)


# ------------------------------------------------------------------------------ channels / curves
def test_plot_channels_1d_and_2d():
    pos = viz.encode_grid(vispos.PositionEmbeddingSine(8), (20,))
    fig = viz.plot_channels(pos)
    assert len(fig.axes) == 2  # heatmap + colorbar
    np.testing.assert_array_equal(_images(fig.axes[0])[0], pos.numpy())
    fig = viz.plot_channels(pos, channels=[1, 5])
    np.testing.assert_array_equal(_images(fig.axes[0])[0], pos[[1, 5]].numpy())
    pos2 = viz.encode_grid(vispos.PositionEmbeddingSine(8), (5, 6))
    fig = viz.plot_channels(pos2, max_panels=6)
    assert len(fig.axes) == 6 + 1
    np.testing.assert_array_equal(_images(fig.axes[-2])[0], pos2[15].numpy())  # last panel = last channel
    fig = viz.plot_channels(pos2, channels=[0, 3, 9])
    assert len(fig.axes) == 3 + 1
    with pytest.raises(ValueError, match=r"channels must index the 16 channels"):
        viz.plot_channels(pos2, channels=[16])
    with pytest.raises(TypeError, match="channels entry must be an int, got 1.5"):
        viz.plot_channels(pos2, channels=[1.5])
    with pytest.raises(ValueError, match="1 or 2 spatial axes"):
        viz.plot_channels(torch.zeros(4, 2, 2, 2))
    with pytest.raises(TypeError, match="pos must be a Tensor"):
        viz.plot_channels(np.zeros((4, 5)))
    with pytest.raises(ValueError, match="max_panels must be a positive int, got 0"):
        viz.plot_channels(pos2, max_panels=0)


def test_plot_sincos_curves():
    enc = vispos.PositionEmbeddingSine(16)
    pos = viz.encode_grid(enc, (30,))
    lam = viz.channel_wavelengths(enc, 30)
    fig = viz.plot_sincos_curves(pos, [0, 4, 15], wavelengths=lam, positions=torch.arange(1, 31))
    assert len(fig.axes) == 3
    np.testing.assert_array_equal(fig.axes[1].lines[0].get_ydata(), pos[4].numpy())
    np.testing.assert_array_equal(fig.axes[1].lines[0].get_xdata(), np.arange(1, 31))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["channel 0", f"wavelength {float(lam[0]):.3g}"]
    assert "(> range)" in fig.axes[2].get_legend().get_texts()[1].get_text()
    with pytest.raises(ValueError, match="wavelengths must give one value per channel"):
        viz.plot_sincos_curves(pos, [0], wavelengths=[1.0])
    with pytest.raises(ValueError, match="positions must have length 30"):
        viz.plot_sincos_curves(pos, [0], positions=range(5))
    with pytest.raises(ValueError, match="1 spatial axes"):
        viz.plot_sincos_curves(torch.zeros(4, 3, 3), [0])


# ------------------------------------------------------------------------------ similarity
def test_plot_similarity_2d_matches_reference():
    pos = viz.encode_grid(vispos.PositionEmbeddingSine(8, normalize=True), (6, 7))
    mask = torch.zeros(6, 7, dtype=torch.bool)
    mask[4:] = True
    fig = viz.plot_similarity(pos, [(1, 2), (3, 3)], mask=mask)
    assert len(fig.axes) == 2 + 1
    for ax, q in zip(fig.axes[:2], [(1, 2), (3, 3)]):
        torch.testing.assert_close(torch.as_tensor(np.asarray(_images(ax)[0])).double(), _ref_cosine(pos, q),
                                   atol=1e-6, rtol=0)
        assert ax.get_title() == f"query {q}"
    default = viz.plot_similarity(pos, mask=mask)  # 3 queries inside the valid 4x7 region
    assert len(default.axes) == 3 + 1
    assert [ax.get_title() for ax in default.axes[:3]] == [f"query {q}" for q in viz.query_cells((4, 7), 3)]


def test_plot_similarity_3d_slices():
    pos = viz.encode_grid(vispos.PositionEmbeddingSine(8, normalize=True), (4, 5, 6))
    fig = viz.plot_similarity(pos, [(1, 2, 3), (2, 2, 2)])
    assert len(fig.axes) == 2 * 3 + 1
    ref = _ref_cosine(pos, (1, 2, 3))
    # sagittal fixes axis 0 and is transposed for origin="lower"
    torch.testing.assert_close(torch.as_tensor(np.asarray(_images(fig.axes[0])[0])).double(), ref[1].T,
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.as_tensor(np.asarray(_images(fig.axes[2])[0])).double(), ref[:, :, 3].T,
                               atol=1e-6, rtol=0)


def test_plot_similarity_to_scale_in_millimetres():
    # spacing draws every panel to scale and encode_grid places the cells in millimetres
    enc = vispos.PositionEmbeddingSine(8, normalize=True, extent=20.0)
    spacing = (5.0, 1.0, 2.0)
    pos = viz.encode_grid(enc, (4, 5, 6), spacing=spacing)
    mask = torch.zeros(1, 4, 5, 6, dtype=torch.bool)
    torch.testing.assert_close(pos, enc(mask, spacing=torch.tensor([spacing]))[0], rtol=0, atol=0)
    fig = viz.plot_similarity(pos, [(1, 2, 3)], spacing=spacing)
    # sagittal (H right, W up), coronal (D right, W up), axial (D right, H up)
    assert [ax.get_aspect() for ax in fig.axes[:3]] == [2.0 / 1.0, 2.0 / 5.0, 1.0 / 5.0]
    torch.testing.assert_close(torch.as_tensor(np.asarray(_images(fig.axes[1])[0])).double(),
                               _ref_cosine(pos, (1, 2, 3))[:, 2].T, atol=1e-6, rtol=0)
    flat = viz.plot_similarity(pos[:, 0], [(1, 1)], spacing=torch.tensor([1.0, 2.0]))
    assert flat.axes[0].get_aspect() == 0.5
    with pytest.raises(ValueError, match=r"spacing must hold 3 positive numbers \(mm\), got \(1.0, 2.0\)"):
        viz.plot_similarity(pos, spacing=(1.0, 2.0))
    with pytest.raises(ValueError, match="spacing must hold 3 positive numbers"):
        viz.plot_similarity(pos, spacing=(1.0, 0.0, 1.0))
    with pytest.raises(TypeError, match="spacing must be a sequence of 3 numbers"):
        viz.plot_similarity(pos, spacing="abc")
    with pytest.raises(TypeError, match="PositionalEncoding2D takes no spacing"):
        viz.encode_grid(vispos.PositionalEncoding2D(8), (4, 5), spacing=(1.0, 1.0))


def test_plot_similarity_errors():
    pos = torch.rand(4, 5, 6)
    with pytest.raises(ValueError, match="must index a cell"):
        viz.plot_similarity(pos, [(5, 0)])
    with pytest.raises(ValueError, match="at least one cell"):
        viz.plot_similarity(pos, [])
    with pytest.raises(ValueError, match=r"mask must have the spatial shape \(5, 6\)"):
        viz.plot_similarity(pos, mask=torch.zeros(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        viz.plot_similarity(pos, mask=torch.zeros(5, 6, dtype=torch.uint8))
    with pytest.raises(ValueError, match="2 or 3 spatial axes"):
        viz.plot_similarity(torch.rand(4, 5))


# ------------------------------------------------------------------------------ batch / coords
def test_plot_padded_batch():
    batch = vispos.nested_tensor_from_tensor_list([torch.rand(3, 6, 8), torch.rand(3, 4, 5), torch.rand(3, 5, 8)])
    fig = viz.plot_padded_batch(batch, names=["a", "b", "c"])
    assert len(fig.axes) == 6
    np.testing.assert_array_equal(_images(fig.axes[3])[0], batch.mask[1].numpy())
    assert fig.axes[2].get_title() == "b: 4x5 valid"
    grey = vispos.nested_tensor_from_tensor_list([torch.rand(1, 4, 4)])
    assert len(viz.plot_padded_batch(grey).axes) == 2
    with pytest.raises(TypeError, match="batch must be a NestedTensor"):
        viz.plot_padded_batch(torch.rand(1, 3, 4, 4))
    with pytest.raises(ValueError, match="names must have one entry per item"):
        viz.plot_padded_batch(batch, names=["a"])
    with pytest.raises(ValueError, match="2D NestedTensor with 1 or 3 channels"):
        viz.plot_padded_batch(vispos.nested_tensor_from_tensor_list([torch.rand(2, 4, 4)]))


@pytest.mark.parametrize("offset", [0.0, -0.5])
def test_plot_normalized_coords_matches_formula(offset):
    mask = torch.zeros(2, 4, 5, dtype=torch.bool)
    mask[1, 3:] = True
    mask[1, :, 3:] = True
    fig = viz.plot_normalized_coords(mask, offset=offset)
    assert len(fig.axes) == 2 * 5 + 1
    ref_y, ref_x = _ref_detr_normalized(mask, offset=offset)
    blind_y, blind_x = _ref_detr_normalized(torch.zeros_like(mask), offset=offset)
    row = fig.axes[5:10]  # item 1
    for ax, ref in zip(row[1:], (ref_y[1], ref_x[1], blind_y[1], blind_x[1])):
        shown = _images(ax)[0]
        # fully padded lines hold DETR's huge (offset / eps) values: relative tolerance of float32
        torch.testing.assert_close(torch.as_tensor(np.asarray(shown.data)).double(), ref, atol=1e-5, rtol=1e-6)
    # the valid cells reach (n + offset) / n * scale whatever the padding; the mask-blind grid does not
    assert row[2].get_title() == f"normalised x: valid max {(3 + offset) / 3 * 2 * math.pi:.2f}"
    assert row[4].get_title() == f"mask-blind x: valid max {float(blind_x[1, 0, 2]):.2f}"
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        viz.plot_normalized_coords(mask.float())
    with pytest.raises(ValueError, match=r"mask must have shape \(B, H, W\)"):
        viz.plot_normalized_coords(mask[0])


# ------------------------------------------------------------------------------ rotary
def test_plot_rotary_invariance():
    rot = vispos.RotaryEmbedding(16)
    fig = viz.plot_rotary_invariance(rot, 12, seed=3)
    assert len(fig.axes) == 3  # matrix, curves, colorbar
    scores = torch.as_tensor(np.asarray(_images(fig.axes[0])[0]))
    # reference: rotate by hand with the RoFormer formula (interleaved pairs)
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    w = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)

    def rotate(v, m):
        out = v.double().clone()
        for i in range(8):
            a, b = v[2 * i].double(), v[2 * i + 1].double()
            c, s = math.cos(m * w[i]), math.sin(m * w[i])
            out[2 * i], out[2 * i + 1] = a * c - b * s, a * s + b * c
        return out

    ref = torch.tensor([[float(rotate(q, m) @ rotate(k, n)) for n in range(12)] for m in range(12)],
                       dtype=torch.float64)
    torch.testing.assert_close(scores.double(), ref, atol=1e-4, rtol=1e-5)
    curves = fig.axes[1].lines
    assert len(curves) == 3
    # the curves coincide where they overlap: S[m, m + d] does not depend on m
    common = set(curves[0].get_xdata()) & set(curves[2].get_xdata())
    a = dict(zip(curves[0].get_xdata(), curves[0].get_ydata()))
    b = dict(zip(curves[2].get_xdata(), curves[2].get_ydata()))
    np.testing.assert_allclose([a[d] for d in sorted(common)], [b[d] for d in sorted(common)], atol=1e-4)
    with pytest.raises(TypeError, match="rotary must be a RotaryEmbedding"):
        viz.plot_rotary_invariance(vispos.PositionEmbeddingSine(8))
    with pytest.raises(ValueError, match="length must be >= 2, got 1"):
        viz.plot_rotary_invariance(rot, 1)


# ------------------------------------------------------------------------------ main job layout
@pytest.mark.parametrize("n_volumes", [1, 3])
def test_volume_figure_readable(tmp_path, n_volumes):
    """One block per volume, one row per level: no 15-panel strip, whatever the batch size."""
    from vispos.app.png import plot_volume_similarity

    vols = [torch.rand(1, 10 - i, 12, 8 + i) for i in range(n_volumes)]
    nt = vispos.nested_tensor_from_tensor_list(vols)
    pe = vispos.PositionEmbeddingSine(8, normalize=True)
    levels = [nt] * 4
    path = plot_volume_similarity(nt, levels, [pe(nt)] * 4, tmp_path / "v.png", strides=[4, 8, 16, 32])
    with Image.open(path) as im:
        w, h = im.size
    assert h > 600  # 5 rows of panels, not a 216 px strip
    assert w <= 1450  # at most 3 blocks of 3 columns side by side


# ------------------------------------------------------------------------------ CLI
KIND_ARGS = {
    "channels": ["--shape", "12", "--kw", "num_pos_feats=8"],
    "curves": ["--shape", "20", "--encoder", "SinusoidalPositionalEncoding", "--kw", "dim=8"],
    "wavelengths": ["--num-feats", "16"],
    "similarity": ["--shape", "4", "5", "6", "--queries", "1,2,3"],
    "similarity-mm": ["--shape", "4", "5", "6", "--spacing", "5", "1", "1", "--kw", "normalize=true", "extent=20"],
    "batch": ["--samples", "astronaut", "chelsea", "--max-size", "48"],
    "coords": ["--samples", "astronaut", "chelsea", "--max-size", "64", "--stride", "8"],
    "rotary": ["--length", "10", "--kw", "dim=8"],
}


@pytest.mark.parametrize("kind", sorted(KIND_ARGS))
def test_cli_plot_writes_png(tmp_path, capsys, kind):
    out = tmp_path / f"{kind}.png"
    rc = main(["plot", kind.split("-")[0], *KIND_ARGS[kind], "--dpi", "40", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    assert [p.name for p in tmp_path.iterdir()] == [f"{kind}.png"]  # no temporary left behind


def test_cli_plot_config_and_default(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "pe.yaml"
    cfg.write_text("type: PositionEmbeddingSine\nnum_pos_feats: 8\nnormalize: true\n")
    assert main(["plot", "similarity", "--config", str(cfg), "--out", str(tmp_path / "s.png")]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "similarity"]) == 0  # defaults alone draw something
    assert (tmp_path / "vispos-plot-similarity.png").stat().st_size > 10_000
    capsys.readouterr()


@pytest.mark.parametrize(
    "argv, match",
    [
        (["plot", "similarity", "--encoder", "Nope"], "unknown type 'Nope'"),
        (["plot", "similarity", "--kw", "normalize"], "--kw expects KEY=VALUE"),
        (["plot", "similarity", "--kw", "num_pos_feats=7"], "num_pos_feats must be a positive even int"),
        (["plot", "similarity", "--kw", "bogus=1"], r"unknown keys \['bogus'\]"),
        (["plot", "similarity", "--shape", "8"], "similarity draws a 2D or 3D grid"),
        (["plot", "similarity", "--queries", "a,b"], "--queries expects comma-separated ints"),
        (["plot", "similarity", "--queries", "40,1"], "must index a cell"),
        (["plot", "channels", "--shape", "2", "2", "2"], "channels draws a 1D or 2D grid"),
        (["plot", "channels", "--encoder", "PositionalEncoding1D", "--kw", "channels=8", "--shape", "4", "4"],
         r"PositionalEncoding1D encodes 1 spatial axes, got shape \(4, 4\)"),
        (["plot", "curves", "--shape", "4", "4"], "curves draws a 1D grid"),
        (["plot", "curves", "--channels", "999"], "channels must index"),
        (["plot", "rotary", "--encoder", "PositionEmbeddingSine"], "rotary must be a RotaryEmbedding"),
        (["plot", "wavelengths", "--num-feats", "7"], "num_feats must be a positive even int"),
        (["plot", "coords", "--stride", "0"], "--stride must be from 1 to 1024, got 0"),
        (["plot", "similarity", "--out", "figure.jpg"], "--out must name a .png file"),
        (["plot", "similarity", "--out", "/nonexistent-dir/x.png"], "folder '/nonexistent-dir' does not exist"),
        (["plot", "similarity", "--config", "missing.yaml"], "does not exist"),
        (["plot", "similarity", "--config", "x.yaml", "--encoder", "PositionEmbeddingSine"], "cannot be combined"),
        (["plot", "batch", "--samples", "nosuchphoto"], "nosuchphoto"),
        (["plot", "similarity", "--shape", "4", "5", "--spacing", "1"], "--spacing must give 2 positive sizes in mm"),
        (["plot", "similarity", "--shape", "4", "5", "--spacing", "1", "-2"], "--spacing must give 2 positive sizes"),
        (["plot", "similarity", "--voxel-positions"], "--voxel-positions needs --spacing"),
        (["plot", "channels", "--shape", "8", "--spacing", "2"], "--spacing is for the similarity figure, not channels"),
        (["plot", "similarity", "--spacing", "1", "1", "--encoder", "PositionalEncoding2D", "--kw", "channels=8"], "PositionalEncoding2D takes no spacing"),
    ],
)
def test_cli_plot_errors(tmp_path, capsys, monkeypatch, argv, match):
    import re

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vispos plot: error: ") and err.count("\n") == 1
    assert re.search(match, err), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, match",
    [
        (["channels", "--shape", "1000000"], r"--shape 1000000 has 1,000,000 cells; vispos plot draws at most 262,144"),
        (["similarity", "--shape", "20000", "20000"], r"--shape 20000 20000 has 400,000,000 cells"),
        (["similarity", "--shape", "200", "200", "200"], r"--shape 200 200 200 has 8,000,000 cells"),
        (["channels", "--dpi", "100000"], r"--dpi must be from 10 to 1200, got 100000"),
        (["channels", "--shape", "512", "512", "--kw", "num_pos_feats=1024"],
         r"--shape 512 512 with 2048 channels needs 2,048 MiB for the encoding; at most 256 MiB"),
        (["channels", "--shape", "64", "64", "--channels", *map(str, range(64)), "--dpi", "1200"],
         r"--dpi 1200 would render a 12,480x44,640-pixel figure, more than 67,108,864 pixels; give --dpi 416 or less"),
        (["curves", "--channels", *map(str, range(65))], r"--channels takes at most 64 values, got 65"),
        (["similarity", "--queries", *["1,1"] * 17], r"--queries takes at most 16 values, got 17"),
        (["wavelengths", "--temperatures", *["2"] * 17], r"--temperatures takes at most 16 values, got 17"),
        (["wavelengths", "--num-feats", "1000000"], r"--num-feats must be from 2 to 65536, got 1000000"),
        (["rotary", "--length", "100000"], r"--length must be from 2 to 4096, got 100000"),
        (["rotary", "--length", "4096", "--kw", "dim=100000"], r"--length 4096 with a rotary dim of 100000 needs 3,189 MiB"),
        (["batch", "--samples", *["astronaut"] * 17], r"--samples takes at most 16 values, got 17"),
        (["batch", "--max-size", "100000"], r"--max-size must be from 8 to 4096, got 100000"),
    ],
)
def test_cli_plot_bounds_are_checked_before_any_work(tmp_path, capsys, monkeypatch, argv, match):
    """Issue 26 item 11: --shape 1000000 grew past 2.5 GB, --dpi 100000 ended in
    std::bad_alloc, --shape 20000 20000 asked for hundreds of GB. Each bound is derived from the
    arguments and answered (exit 2, the flag named) before the encoding or the canvas exists."""
    import re
    import time

    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    assert main(["plot", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vispos plot: error: ") and err.count("\n") == 1
    assert re.search(match, err), err
    assert list(tmp_path.iterdir()) == []
    assert time.perf_counter() - start < 30


def test_cli_plot_bad_kind_exits_2(capsys):
    assert main(["plot", "histogram"]) == 2
    err = capsys.readouterr().err
    assert "unknown plot kind 'histogram'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("n_levels", [1, 4])
def test_image_figure_width_does_not_grow_with_levels(tmp_path, n_levels):
    """The 2D main-job figure keeps 1 + n_queries columns; levels add rows, not columns."""
    from vispos.app.png import plot_position_similarity

    nt = vispos.nested_tensor_from_tensor_list([torch.rand(3, 16, 20), torch.rand(3, 12, 20)])
    pe = vispos.PositionEmbeddingSine(8, normalize=True)
    levels = [nt] * n_levels
    path = plot_position_similarity(nt, levels, [pe(nt)] * n_levels, tmp_path / "f.png", imagenet_normalized=False,
                                    strides=list(range(n_levels)))
    with Image.open(path) as im:
        w, h = im.size
    assert w == 1008  # (2.6 * 4 + 0.8) in at 90 dpi, whatever n_levels
    assert 2 * n_levels * 150 < h < 2 * n_levels * 260


def _similarity_figure(*extra):
    from vispos.app import _plot_command
    from vispos.app.cli import _parser

    args = _parser().parse_args(["plot", "similarity", "--shape", "6", "8", "10", *extra])
    fig = _plot_command._figure(args)
    images = [image.get_array() for ax in fig.axes for image in ax.get_images()]
    return fig, images


def test_cli_similarity_in_millimetres_differs_from_voxel_positions():
    """``--spacing`` places cells in millimetres: the maps differ from ``--voxel-positions``
    (they were equal everywhere but the title), and the title says what each shows."""
    import numpy as np

    mm_fig, mm = _similarity_figure("--spacing", "3", "0.8", "0.8")
    vox_fig, vox = _similarity_figure("--spacing", "3", "0.8", "0.8", "--voxel-positions")
    assert len(mm) == len(vox) > 0
    assert any(not np.allclose(a, b, atol=1e-3) for a, b in zip(mm, vox))
    assert "positions in millimetres over 18 mm (normalize, extent)" in mm_fig._suptitle.get_text()
    assert "positions in voxel indices" in vox_fig._suptitle.get_text()


def test_cli_similarity_spacing_cancelled_by_normalisation_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["plot", "similarity", "--shape", "6", "8", "--spacing", "3", "0.8",
            "--encoder", "PositionEmbeddingSine", "--kw", "normalize=true"]
    assert main(argv) == 2
    assert "extent=" in capsys.readouterr().err
