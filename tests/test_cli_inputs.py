"""The ``vispos`` command never writes over its own inputs, and a path that exists but is not a
regular file (``/dev/zero``, a FIFO) is named as such, never as missing."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from vispos.app._io import write_files
from vispos.app.cli import main
from vispos.config import resolve_config

TINY = """
type: Joiner
backbone: {type: TimmBackbone, model_name: resnet18, out_indices: [3, 4]}
position_embedding: {type: PositionEmbeddingSine, num_pos_feats: 16, normalize: true}
"""


def _image(path):
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(path)
    return path.read_bytes()


@pytest.mark.parametrize("force", [False, True])
def test_run_refuses_to_write_over_an_input_image(tmp_path, monkeypatch, capsys, force):
    """``vispos run --images figure.png --out .`` would replace the photo with the figure."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    photo = _image(tmp_path / "figure.png")
    argv = ["run", "--config", "tiny.yaml", "--images", "figure.png", "--out", ".", "--repeats", "1"]
    assert main(argv + (["--force"] if force else [])) == 2
    err = capsys.readouterr().err
    assert err == (
        "vispos run: error: --out '.' would write './figure.png' over the input 'figure.png'; inputs are never "
        "replaced (--force or not): give --out another folder\n")
    assert (tmp_path / "figure.png").read_bytes() == photo
    assert sorted(os.listdir(tmp_path)) == ["figure.png", "tiny.yaml"]


def test_run_refuses_an_input_reached_through_links(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "out").mkdir()
    photo = _image(tmp_path / "photo.png")
    os.symlink(tmp_path / "photo.png", tmp_path / "out" / "figure.png")  # out/figure.png -> photo.png
    assert main(["run", "--config", "tiny.yaml", "--images", "photo.png", "--out", "out", "--repeats", "1"]) == 2
    assert "over the input 'photo.png'" in capsys.readouterr().err
    os.remove(tmp_path / "out" / "figure.png")
    os.link(tmp_path / "photo.png", tmp_path / "out" / "figure.png")  # a hard link
    assert main(["run", "--config", "tiny.yaml", "--images", "photo.png", "--out", "out", "--repeats", "1"]) == 2
    assert "over the input 'photo.png'" in capsys.readouterr().err
    assert (tmp_path / "photo.png").read_bytes() == photo


def test_run_refuses_to_write_over_its_config_or_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _image(tmp_path / "photo.png")
    (tmp_path / "embeddings.pt").write_text(TINY)  # a config under an output's name
    assert main(["run", "--config", "embeddings.pt", "--images", "photo.png", "--out", ".", "--repeats", "1"]) == 2
    assert "over the input 'embeddings.pt'" in capsys.readouterr().err
    assert (tmp_path / "embeddings.pt").read_text() == TINY


def test_write_files_never_replaces_a_kept_file(tmp_path):
    """The write itself backs the check: a kept file is refused before anything is written."""
    src = tmp_path / "in.png"
    src.write_bytes(b"input")
    other = tmp_path / "other.pt"
    with pytest.raises(ValueError, match=r"cannot write '.*in\.png': it is the input '.*in\.png', which is never replaced"):
        write_files([(other, lambda p: open(p, "wb").write(b"x")), (src, lambda p: open(p, "wb").write(b"x"))],
                    keep=[src])
    assert src.read_bytes() == b"input" and not other.exists()
    assert sorted(os.listdir(tmp_path)) == ["in.png"]  # no temporary left behind


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_resolve_config_names_a_non_regular_file():
    with pytest.raises(ValueError, match=r"config file '/dev/zero' exists but is not a regular file"):
        resolve_config("/dev/zero")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_non_regular_inputs_are_named_as_such(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "pipe.yaml")
    with pytest.raises(ValueError, match=r"exists but is not a regular file"):
        resolve_config(tmp_path / "pipe.yaml")
    (tmp_path / "tiny.yaml").write_text(TINY)
    os.mkfifo(tmp_path / "pipe.png")
    assert main(["run", "--config", "tiny.yaml", "--images", "pipe.png", "--out", "o", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "exists but is not a regular file" in err and "does not exist" not in err


def test_out_naming_an_input_file_is_refused_before_anything_is_read(tmp_path):
    """``vispos run --images keep.jpg --out keep.jpg`` read, ran and timed the whole job (19 s)
    before it found that ``--out`` is not a folder; now the arguments alone refuse it, naming the
    input. ``keep.jpg`` is no image at all: had it been read, the message would say so."""
    import subprocess
    import sys

    (tmp_path / "keep.jpg").write_text("not read")
    (tmp_path / "notes.txt").write_text("")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def vispos(*argv):
        proc = subprocess.run([sys.executable, "-m", "vispos.app.cli", "run", "--images", "keep.jpg", *argv],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
        return proc.stderr

    assert vispos("--out", "keep.jpg").startswith(
        "vispos run: error: --out 'keep.jpg' is the input 'keep.jpg', a file: --out names the folder")
    assert "--out 'notes.txt' exists and is not a folder (a file)" in vispos("--out", "notes.txt")
    assert "--out 'notes.txt/run' cannot be created: " in vispos("--out", "notes.txt/run")
    assert sorted(os.listdir(tmp_path)) == ["keep.jpg", "notes.txt"]
    assert (tmp_path / "keep.jpg").read_text() == "not read"
