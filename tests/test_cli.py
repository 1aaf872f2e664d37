import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

from vispos.app._run_args import WARMUP_CALLS
from vispos.app._run_command import TABLE_HEADER
from vispos.app.cli import main

TINY = """
type: Joiner
backbone: {type: TimmBackbone, model_name: resnet18, out_indices: [3, 4]}
position_embedding: {type: PositionEmbeddingSine, num_pos_feats: 16, normalize: true}
"""


def _write_images(folder, sizes):
    paths = []
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(sizes):
        p = folder / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


def test_demo_on_sample_photos(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "--samples", "astronaut", "chelsea", "--max-size", "96", "--repeats", "1"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "backbone weights: random" in text
    assert "level" in text and "valid frac" in text and "pos time (ms)" in text
    # the steady state after warm-up, the cold first call apart (before: the median of 5 calls from cold)
    header = next(line for line in text.splitlines() if line.startswith("level"))
    assert re.split(r"\s{2,}", header.strip()) == list(TABLE_HEADER)
    assert f"pos time: median of 1 uncached calls after {WARMUP_CALLS} warm-up calls (the steady state" in text
    assert "astronaut: 96x96" in text and "chelsea: 64x96" in text
    saved = torch.load(out / "embeddings.pt", weights_only=False)
    assert saved["names"] == ["astronaut", "chelsea"]
    (level,) = saved["levels"]
    assert level["stride"] == 32 and level["pos"].shape == (2, 256, 3, 3)
    assert (out / "figure.png").stat().st_size > 10_000
    assert sorted(os.listdir(out)) == ["embeddings.pt", "figure.png"]


def test_run_on_user_images_with_config(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    paths = _write_images(tmp_path, [(40, 60), (64, 32), (50, 50)])
    rc = main(["run", "--config", str(cfg), "--images", *paths, "--out", str(tmp_path / "o"), "--repeats", "1", "--queries", "2"])
    text = capsys.readouterr().out
    assert rc == 0
    rows = [line for line in text.splitlines() if line[:1].isdigit()]
    assert len(rows) == 2
    assert "(3, 256, 4, 4)" in rows[0] and " 16 " in rows[0]
    saved = torch.load(tmp_path / "o" / "embeddings.pt", weights_only=False)
    assert [lv["pos"].shape[1] for lv in saved["levels"]] == [32, 32]
    mask = saved["levels"][1]["mask"]
    assert mask.shape == (3, 2, 2) and mask.dtype == torch.bool


@pytest.mark.parametrize(
    "argv, match",
    [
        (["run", "--images", "missing.png"], "does not exist"),
        (["run", "--images", "{notimage}"], "could not be read as an image"),
        (["run", "--images", "{img}", "--config", "missing.yaml"], "config file 'missing.yaml' does not exist"),
        (["run", "--images", "{img}", "--config", "{badcfg}"], "unknown keys"),
        (["demo", "--samples", "not_a_sample"], "unknown scikit-image sample"),
        (["run", "--images", "{img}", "--checkpoint", "nope.pt"], "does not exist"),
        (["run", "--images", "{img}", "--queries", "0"], "--queries must be >= 1"),
    ],
)
def test_errors_are_one_line_and_write_nothing(tmp_path, capsys, argv, match):
    (img,) = _write_images(tmp_path, [(32, 32)])
    notimage = tmp_path / "notimage.png"
    notimage.write_text("hello")
    badcfg = tmp_path / "bad.yaml"
    badcfg.write_text("type: PositionEmbeddingSine\nnum_feats: 3\n")
    argv = [a.format(img=img, notimage=notimage, badcfg=badcfg) for a in argv]
    out = tmp_path / "out"
    rc = main([*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"vispos {argv[0]}: error:") and match in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() or os.listdir(out) == []


# ------------------------------------------------------------------------------------ volumes
TINY_VOLUME = """
type: Joiner
backbone: {type: VolumeBackbone, name_or_model: r3d_18, return_nodes: [layer3, layer4], in_chans: 1, stem_stride: 2}
position_embedding: {type: PositionEmbeddingSine, num_pos_feats: 16, normalize: true}
hidden_dim: 48
num_feature_levels: 3
num_groups: 8
"""


def test_demo_volume_on_mni152(tmp_path, capsys):
    out = tmp_path / "vdemo"
    rc = main(["demo", "--volume", "--out", str(out), "--max-size", "32", "--repeats", "1"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "3 volumes -> batch (3, 1, 27, 32, 26)" in text
    assert "mni152: 27x32x26" in text and "mni152_superior: 27x32x" in text
    rows = [line for line in text.splitlines() if line[:1].isdigit()]
    assert len(rows) == 4 and "(3, 192, 7, 8, 7)" in rows[0] and " 4 " in rows[0]
    assert "flattened for the encoder: src (3, " in text
    saved = torch.load(out / "embeddings.pt", weights_only=False)
    assert saved["names"] == ["mni152", "mni152_coarse", "mni152_superior"]
    assert saved["levels"][0]["mask"].shape == (3, 7, 8, 7)
    assert saved["flat"]["valid_ratios"].shape == (3, 4, 3)
    assert (out / "figure.png").stat().st_size > 10_000
    assert sorted(os.listdir(out)) == ["embeddings.pt", "figure.png"]


def test_run_on_user_volumes(tmp_path, capsys):
    import nibabel as nib

    rng = np.random.default_rng(0)
    paths = []
    for i, shape in enumerate([(20, 24, 16), (16, 16, 24)]):
        p = tmp_path / f"vol{i}.nii.gz"
        nib.save(nib.Nifti1Image(rng.random(shape).astype(np.float32), np.eye(4)), p)
        paths.append(str(p))
    cfg = tmp_path / "tiny3d.yaml"
    cfg.write_text(TINY_VOLUME)
    rc = main(["run", "--config", str(cfg), "--volumes", *paths, "--out", str(tmp_path / "o"), "--repeats", "1",
               "--intensity", "zscore"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "vol0.nii.gz: 20x24x16" in text and "2 volumes -> batch (2, 1, 20, 24, 24)" in text
    rows = [line for line in text.splitlines() if line[:1].isdigit()]
    assert "(2, 48, 3, 3, 3)" in rows[0] and " 8 " in rows[0]
    assert len(rows) == 3
    saved = torch.load(tmp_path / "o" / "embeddings.pt", weights_only=False)
    assert [lv["pos"].shape[1] for lv in saved["levels"]] == [48, 48, 48]
    assert (tmp_path / "o" / "figure.png").exists()


def test_volume_errors(tmp_path, capsys):
    (img,) = _write_images(tmp_path, [(32, 32)])
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    rc = main(["demo", "--volume", "--config", str(cfg), "--max-size", "16", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "builds a 2D backbone but the inputs are volumes (3D)" in err
    rc = main(["run", "--volumes", str(tmp_path / "missing.nii.gz"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "volume file" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --images and --volumes are exclusive (argparse usage error)
        main(["run", "--images", img, "--volumes", img])


# ------------------------------------------------------------------ outputs (issue 12, items 1-3)
def test_directory_in_place_of_the_figure_keeps_the_old_embeddings(tmp_path, capsys):
    """Item 1: ``out/figure.png`` a directory and an old ``out/embeddings.pt``: exit 2, the old
    file untouched, nothing else written."""
    (img,) = _write_images(tmp_path, [(32, 32)])
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    (out / "figure.png").mkdir(parents=True)
    (out / "embeddings.pt").write_text("earlier run")
    rc = main(["run", "--config", str(cfg), "--images", img, "--out", str(out), "--repeats", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "figure.png': it is a directory" in err, err
    assert sorted(os.listdir(out)) == ["embeddings.pt", "figure.png"]
    assert (out / "embeddings.pt").read_text() == "earlier run"


def test_outputs_get_the_mode_open_gives(tmp_path, capsys):
    """Item 3: 0644 under umask 022 (not mkstemp's 0600), also when old outputs are replaced."""
    import stat

    (img,) = _write_images(tmp_path, [(32, 32)])
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    old = os.umask(0o022)
    try:
        for _ in range(2):  # fresh, then over the first run's files
            assert main(["run", "--config", str(cfg), "--images", img, "--out", str(out), "--repeats", "1"]) == 0
            modes = {p: stat.S_IMODE(os.stat(out / p).st_mode) for p in os.listdir(out)}
            assert modes == {"embeddings.pt": 0o644, "figure.png": 0o644}
    finally:
        os.umask(old)


_SIGNAL_SCRIPT = """
import os, signal, sys
import vispos.app._io as vio

real = getattr(vio, sys.argv[1])
calls = []

def hooked(*args):
    out = real(*args)
    calls.append(args)
    if len(calls) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGTERM)
    return out

setattr(vio, sys.argv[1], hooked)
from vispos.app.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.slow
def test_sigterm_in_a_subprocess_leaves_no_temporary_and_no_folder(tmp_path):
    """Item 2: SIGTERM, sent deterministically from inside the write (a hook in a subprocess,
    after both temporaries were written), exits 143 with one line and removes the temporaries
    and the folders the run created."""
    _sigterm_in_subprocess(tmp_path, "_fsync", 2, existing=False)


def test_sigterm_keeps_old_outputs(tmp_path, capsys, monkeypatch):
    """Item 2, in process (pytest keeps SIGTERM's default handler, so write_files handles it):
    a SIGTERM while the old outputs are being backed up leaves them as they were."""
    import signal

    import vispos.app._io as vio

    (img,) = _write_images(tmp_path, [(32, 32)])
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    out.mkdir()
    (out / "embeddings.pt").write_text("old embeddings")
    (out / "figure.png").write_text("old figure")
    real = vio._backup

    def backup_then_term(*args):
        real(*args)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(vio, "_backup", backup_then_term)
    saved = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an earlier test may have set its own
    try:
        rc = main(["run", "--config", str(cfg), "--images", img, "--out", str(out), "--repeats", "1"])
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, saved)
    assert rc == 143 and capsys.readouterr().err.strip() == "vispos run: error: terminated by SIGTERM"
    assert sorted(os.listdir(out)) == ["embeddings.pt", "figure.png"]
    assert (out / "embeddings.pt").read_text() == "old embeddings"
    assert (out / "figure.png").read_text() == "old figure"


def _sigterm_in_subprocess(tmp_path, hook, after, existing):
    import subprocess
    import sys

    (img,) = _write_images(tmp_path, [(32, 32)])
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out" / "nested"
    if existing:
        out.mkdir(parents=True)
        (out / "embeddings.pt").write_text("old embeddings")
        (out / "figure.png").write_text("old figure")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNAL_SCRIPT, hook, str(after), "run", "--config", str(cfg),
         "--images", img, "--out", str(out), "--repeats", "1"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "vispos run: error: terminated by SIGTERM"
    if existing:
        assert sorted(os.listdir(out)) == ["embeddings.pt", "figure.png"]
        assert (out / "embeddings.pt").read_text() == "old embeddings"
        assert (out / "figure.png").read_text() == "old figure"
    else:
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--queries", "100000"], "--queries must be <= 16, got 100000"),
        (["--size-divisibility", "100000"], "--size-divisibility must be <= 4096, got 100000"),
        (["--repeats", "10000000"], "--repeats must be <= 1000, got 10000000"),
        (["--out", ""], "--out must name a folder, got an empty string"),
        (["--device", "meta"], "--device 'meta' holds no data; use cpu or cuda"),
    ],
)
def test_flags_that_would_exhaust_memory_or_misplace_outputs(tmp_path, capsys, monkeypatch, flags, match):
    """Adversarial pass: --queries 100000 drew until the machine ran out of memory,
    --size-divisibility 100000 asked for 120 GB (exit 1), --device meta failed in .item()
    (exit 1), --out '' wrote into the working folder."""
    (img,) = _write_images(tmp_path, [(32, 32)])
    monkeypatch.chdir(tmp_path)
    out = [] if "--out" in flags else ["--out", str(tmp_path / "out")]
    rc = main(["run", "--images", img, *out, *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == f"vispos run: error: {match}"
    assert sorted(os.listdir(tmp_path)) == ["img0.png"]


# ------------------------------------------- issue 26 item 11: bounds derived from the inputs
def _forged_nifti_header(path, shape):
    """A NIfTI-1 file declaring ``shape`` float32, its voxels a hole (a sparse file: the right
    length, no disk used; only the header is read before the batch is refused)."""
    import math

    import nibabel as nib

    hdr = nib.Nifti1Header()
    hdr.set_data_shape(shape)
    hdr.set_data_dtype(np.float32)
    hdr["vox_offset"] = 352
    with open(path, "wb") as fh:
        fh.write(hdr.binaryblock + b"\0" * 4)
        fh.seek(352 + 4 * math.prod(shape) - 1)
        fh.write(b"\0")
    return str(path)


@pytest.mark.parametrize(
    "make, flags, match",
    [
        (lambda d: ["--images", *_write_images(d, [(48, 64)])], ["--size-divisibility", "4096"],
         r"--size-divisibility 4096 would pad the batch from 48x64 to 4096x4096 \(5,461x its cells, at most 4x\); "
         r"give --size-divisibility 110 or less"),
        (lambda d: ["--images", *_write_images(d, [(3000, 4000)]) * 8], [],
         r"the 8 inputs make a padded batch of 8x3x3000x4000 = 288,000,000 values \(1.1 GiB as float32\), more "
         r"than 67,108,864; give --max-size 1930 or less, or fewer inputs"),
        (lambda d: ["--images", *_write_images(d, [(3000, 4000)]) * 8], ["--max-size", "2000"],
         r"8x3x1500x2000 = 72,000,000 values .* give --max-size 1930 or less"),
        (lambda d: ["--volumes", _forged_nifti_header(d / "big.nii", (500, 300, 200)),
                    _forged_nifti_header(d / "big2.nii", (300, 500, 200))], [],
         r"the 2 inputs make a padded batch of 2x1x500x500x200 = 100,000,000 values"),
        (lambda d: ["--volumes", _forged_nifti_header(d / "big.nii", (500, 400, 200, 2))], [],
         r"the 1 input makes a padded batch of 1x2x500x400x200 = 80,000,000 values .* give --max-size 471 or less"),
        (lambda d: ["--images", *_write_images(d, [(8, 8)]) * 65], [],
         r"--images takes at most 64 files per run \(one figure row each\), got 65"),
    ],
)
def test_run_refuses_batches_that_cannot_fit_before_decoding(tmp_path, capsys, monkeypatch, make, flags, match):
    """Issue 26 item 11: ``vispos run --size-divisibility 4096`` took 21 s and 3.2 GB on one 48x64
    image. The padded batch is computed from the file headers (after --max-size) and refused
    before any file is decoded (the loaders would fail this test) when it cannot fit."""
    import re

    import vispos.app._run_command as cli

    def must_not_load(*args, **kwargs):
        raise AssertionError("a file was decoded before the batch was checked")

    monkeypatch.setattr(cli, "load_images", must_not_load)
    monkeypatch.setattr(cli, "load_volumes", must_not_load)
    inputs = make(tmp_path)
    rc = main(["run", *inputs, *flags, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert re.search(match, err), err
    assert err.startswith("vispos run: error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_size_divisibility_that_fits_still_runs(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    paths = _write_images(tmp_path, [(48, 64)])
    rc = main(["run", "--config", str(cfg), "--images", *paths, "--size-divisibility", "96",
               "--out", str(tmp_path / "o"), "--repeats", "1"])
    assert rc == 0, capsys.readouterr().err
    saved = torch.load(tmp_path / "o" / "embeddings.pt", weights_only=False)
    assert saved["levels"][1]["mask"].shape == (1, 3, 3)  # 96x96 at stride 32


def test_demo_refuses_sizes_it_cannot_make(capsys):
    """Careful-user pass: ``vispos demo --volume --max-size 4096`` enlarged the MNI152 template
    to tens of GB."""
    assert main(["demo", "--volume", "--max-size", "4096"]) == 2
    assert "--max-size must be from 8 to 256 with --volume" in capsys.readouterr().err
    assert main(["demo", "--samples", *["astronaut"] * 65]) == 2
    assert "--samples takes at most 64 files per run" in capsys.readouterr().err


def test_figure_dpi_is_lowered_for_huge_figures(capsys):
    from matplotlib.figure import Figure

    from vispos.app._run_command import MAX_FIGURE_PIXELS, _figure_dpi

    assert _figure_dpi(Figure(figsize=(10, 8)), 90) == 90
    dpi = _figure_dpi(Figure(figsize=(45, 600)), 90)  # 64 items x 4 levels x 16 queries
    assert dpi == 49 and 45 * 600 * dpi**2 <= MAX_FIGURE_PIXELS < 45 * 600 * (dpi + 1) ** 2
    assert "figure.png drawn at 49 dpi instead of 90" in capsys.readouterr().out


# ------------------------------------- nothing the user did not name is overwritten (issue 32, 6)
def test_plot_default_file_is_not_replaced_without_force(tmp_path, monkeypatch, capsys):
    """``vispos plot similarity`` for a 2D and then a 3D encoder wrote the same default file, the
    second silently replacing the first."""
    monkeypatch.chdir(tmp_path)
    default = tmp_path / "vispos-plot-similarity.png"
    assert main(["plot", "similarity", "--shape", "6", "8", "--dpi", "30"]) == 0
    first = default.read_bytes()
    assert main(["plot", "similarity", "--shape", "4", "5", "6", "--dpi", "30"]) == 2
    err = capsys.readouterr().err
    assert err == ("vispos plot: error: vispos-plot-similarity.png exists (an earlier vispos plot similarity wrote "
                   "it?) and is not replaced unless asked: give --out FILE.png to name this figure, or --force "
                   "to replace vispos-plot-similarity.png\n")
    assert default.read_bytes() == first
    assert main(["plot", "similarity", "--shape", "4", "5", "6", "--dpi", "30", "--force"]) == 0
    assert default.read_bytes() != first
    assert main(["plot", "similarity", "--shape", "4", "5", "6", "--dpi", "30", "--out", "s3d.png"]) == 0
    named = (tmp_path / "s3d.png").read_bytes()
    assert main(["plot", "similarity", "--shape", "6", "8", "--dpi", "30", "--out", "s3d.png"]) == 0
    assert (tmp_path / "s3d.png").read_bytes() != named  # a file the user named is replaced, as asked
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s3d.png", "vispos-plot-similarity.png"]


def test_plot_default_name_taken_by_a_dangling_link_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.symlink(tmp_path / "elsewhere.png", tmp_path / "vispos-plot-wavelengths.png")
    assert main(["plot", "wavelengths", "--dpi", "30"]) == 2
    assert "vispos-plot-wavelengths.png exists" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere.png").exists()


def test_plot_never_replaces_a_default_file_that_appears_while_drawing(tmp_path, monkeypatch, capsys):
    """The check before drawing is backed by the write itself (checked again before anything is
    written, then ``link(2)``, which refuses a name that exists: tests/test_io.py), so a file
    that appears meanwhile is kept."""
    import vispos.app._plot_command as plot_command

    monkeypatch.chdir(tmp_path)
    real = plot_command._figure

    def figure_then_race(args):
        fig = real(args)
        (tmp_path / "vispos-plot-wavelengths.png").write_bytes(b"theirs")
        return fig

    monkeypatch.setattr(plot_command, "_figure", figure_then_race)
    assert main(["plot", "wavelengths", "--dpi", "30"]) == 2
    assert ("vispos plot: error: cannot write 'vispos-plot-wavelengths.png': it exists and is not to be "
            "replaced\n") == capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["vispos-plot-wavelengths.png"]
    assert (tmp_path / "vispos-plot-wavelengths.png").read_bytes() == b"theirs"


def test_run_default_folder_is_not_replaced_without_force(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    paths = _write_images(tmp_path, [(40, 60)])
    argv = ["run", "--config", str(cfg), "--images", *paths, "--repeats", "1"]
    assert main(argv) == 0
    before = (tmp_path / "vispos-out" / "embeddings.pt").read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "vispos run: error: vispos-out/ (the default output folder) already holds embeddings.pt and figure.png "
        "from an earlier run; give --out FOLDER for this run, or --force to replace them\n")
    assert (tmp_path / "vispos-out" / "embeddings.pt").read_bytes() == before
    assert main([*argv, "--force"]) == 0
    assert main([*argv, "--out", "vispos-out"]) == 0  # named: replaced, as asked
    assert sorted(os.listdir(tmp_path / "vispos-out")) == ["embeddings.pt", "figure.png"]


def test_volume_default_folder_is_checked_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vispos-demo-volume").mkdir()
    (tmp_path / "vispos-demo-volume" / "figure.png").write_bytes(b"old")
    assert main(["demo", "--volume"]) == 2
    assert "vispos-demo-volume/ (the default output folder) already holds figure.png" in capsys.readouterr().err
    assert (tmp_path / "vispos-demo-volume" / "figure.png").read_bytes() == b"old"


# ------------------------------------------------ the README lists what the command offers (6)
def _plot_kinds():
    from vispos.app._plot_args import KINDS

    return list(KINDS)


def test_readme_lists_exactly_the_plot_kinds():
    """The README listed 7 plot kinds while the command offered 9."""
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as fh:
        text = fh.read()
    found = re.search(r"`vispos plot KIND` draws one figure of any vispos encoder, KIND one of: (.*?) \(", text, re.S)
    assert found, "the README's plot-kinds sentence is gone"
    assert re.findall(r"`([^`]+)`", found.group(1)) == _plot_kinds()


def test_cli_docs_table_lists_exactly_the_plot_kinds():
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "cli.md")) as fh:
        text = fh.read()
    section = text.split("## vispos plot KIND", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert rows == _plot_kinds()
