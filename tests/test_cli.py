import os

import numpy as np
import pytest
import torch
from PIL import Image

from vispos.cli import main

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
    assert err.startswith("vispos: error:") and match in err
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
               "--normalize", "zscore"])
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
from vispos.cli import main
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
    assert rc == 143 and capsys.readouterr().err.strip() == "vispos: error: terminated by SIGTERM"
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
    assert proc.stderr.strip().splitlines()[-1] == "vispos: error: terminated by SIGTERM"
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
    assert rc == 2 and err.strip() == f"vispos: error: {match}"
    assert sorted(os.listdir(tmp_path)) == ["img0.png"]
