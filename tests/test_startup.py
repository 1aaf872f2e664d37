"""The command starts at once (issue 32 item 3): ``vispos --help``, every subcommand's ``--help``
and ``vispos config list`` import no torch; a subcommand imports what it needs when it runs, and
no more (``vispos plot`` never loads a backbone library). ``import vispos`` loads its API on
first use and otherwise works as before. Times are in ``benchmarks/bench_startup.py``, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("torch", "torchvision", "timm", "numpy", "matplotlib", "PIL", "skimage")


def _loaded(code: str, tmp_path, *argv: str) -> dict:
    """Runs ``code`` in a fresh interpreter (from ``tmp_path``, outside the checkout) with
    ``sys.argv[1:] = argv``; returns ``{"heavy": [...], "rc": ..., "out": ...}``."""
    probe = (
        "import io, json, sys, contextlib\n"
        "buf, rc = io.StringIO(), 0\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try:\n" + "".join(f"        {line}\n" for line in code.splitlines()) +
        "    except SystemExit as exc:\n"
        "        rc = exc.code\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print(json.dumps({'heavy': heavy, 'rc': rc, 'out': buf.getvalue()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", probe, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


MAIN = "from vispos.app.cli import main\nsys.exit(main())"


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["demo", "--help"], ["run", "--help"], ["plot", "--help"], ["config", "--help"],
     ["config", "list", "--help"], ["config", "list"], ["config", "show", "detr_resnet18"],
     ["train", "--help"], ["train", "--volume", "--help"], ["--version"]],
    ids=" ".join,
)
def test_help_and_config_list_import_no_torch(tmp_path, argv):
    """Before: every command imported torch, torchvision and timm first (3.3 s and 1.1 GB for
    ``vispos --help``)."""
    got = _loaded(MAIN, tmp_path, *argv)
    assert got["rc"] == 0
    assert got["heavy"] == []
    assert "usage: vispos" in got["out"] or "detr_resnet" in got["out"] or got["out"].startswith("vispos ")


@pytest.mark.parametrize("alias", ["vispos.cli", "vispos.app.cli"])
def test_module_entry_points_answer_help_without_torch(tmp_path, alias):
    got = _loaded(f"import runpy\nrunpy.run_module({alias!r}, run_name='__main__')", tmp_path, "--help")
    assert got["rc"] == 0 and "usage: vispos" in got["out"]
    assert got["heavy"] == []


def test_bad_arguments_are_answered_before_torch(tmp_path):
    """A usage error and a flag beyond its bound are answered before any heavy import."""
    got = _loaded(MAIN, tmp_path, "plot", "histogram")
    assert got["rc"] == 2 and got["heavy"] == []
    code = MAIN.replace("sys.exit(main())", "rc = main()\nassert rc == 2, rc")
    assert _loaded(code, tmp_path, "plot", "similarity", "--dpi", "100000")["heavy"] == []
    assert _loaded(code, tmp_path, "demo", "--queries", "99")["heavy"] == []
    assert _loaded(code, tmp_path, "train", "--resume", "missing.pt")["heavy"] == []
    got = _loaded(MAIN, tmp_path, "train", "--steps", "0")
    assert got["rc"] == 2 and got["heavy"] == []


_UNTIL_WORK = (
    "import vispos.app.cli as cli\n"
    "real = cli.load_command\n"
    "cli.load_command = lambda command: (real(command), lambda args: None)[1]\n"
    "assert cli.main() == 0"
)


def test_plot_loads_torch_but_no_backbone_library(tmp_path):
    """``vispos plot`` up to its work: torch and the figures, not timm / torchvision (before, the
    config registry imported every backbone to build an encoder)."""
    got = _loaded(_UNTIL_WORK, tmp_path, "plot", "similarity", "--out", "s.png")
    assert "torch" in got["heavy"]
    assert "timm" not in got["heavy"] and "torchvision" not in got["heavy"]


def test_encoder_config_builds_without_backbone_libraries(tmp_path):
    code = (
        "import vispos\n"
        "pe = vispos.build_from_config({'type': 'PositionEmbeddingSine', 'num_pos_feats': 8})\n"
        "names = vispos.config.registered()\n"
        "assert {'Joiner', 'TimmBackbone', 'TorchvisionBackbone', 'VolumeBackbone', 'DetrEncoder'} <= set(names)\n"
        "assert type(pe).__name__ == 'PositionEmbeddingSine'"
    )
    got = _loaded(code, tmp_path)
    assert "torch" in got["heavy"]
    assert "timm" not in got["heavy"] and "torchvision" not in got["heavy"]


def test_import_vispos_alone_imports_no_torch(tmp_path):
    got = _loaded("import vispos, vispos.config, vispos.app.cli\nassert vispos.__version__", tmp_path)
    assert got["heavy"] == []


def test_vispos_names_load_on_first_use_as_before():
    """Every name of ``vispos.__all__`` resolves, to the object of its home module, and the
    submodules an eager import bound are there too."""
    import vispos
    import vispos.encodings
    import vispos.padding

    for name in vispos.__all__:
        assert getattr(vispos, name) is not None
    assert vispos.PositionEmbeddingSine is vispos.encodings.PositionEmbeddingSine
    assert vispos.Padding is vispos.padding.Padding
    assert set(vispos.__all__) <= set(dir(vispos))
    assert vispos.nested_tensor.NestedTensor is vispos.NestedTensor
    namespace: dict = {}
    exec("from vispos import *", namespace)
    assert set(vispos.__all__) <= set(namespace)


@pytest.mark.parametrize("name", ["NotAThing", "__wrapped__"])
def test_missing_names_raise_attribute_error(name):
    import vispos

    with pytest.raises(AttributeError, match=f"module 'vispos' has no attribute '{name}'"):
        getattr(vispos, name)
    assert not hasattr(vispos, name)


def test_dunder_lookups_import_nothing(tmp_path):
    """Tools probe modules for dunders (``__wrapped__``, ``__path__`` ...): no heavy import."""
    got = _loaded("import vispos, vispos.app.data\nhasattr(vispos, '__wrapped__')\n"
                  "hasattr(vispos.app.data, '__file__')", tmp_path)
    assert got["heavy"] == []


def test_app_data_names_load_on_first_use():
    import vispos.app.data as data
    import vispos.app.data.images as images
    import vispos.app.data.volumes as volumes

    assert data.load_image is images.load_image and data.load_volumes is volumes.load_volumes
    assert data.SAMPLE_IMAGES == images.SAMPLE_IMAGES == ("astronaut", "coffee", "chelsea", "rocket")
    assert data.VOLUME_NORMALIZATIONS == volumes.VOLUME_NORMALIZATIONS
    with pytest.raises(AttributeError, match="module 'vispos.app.data' has no attribute 'nope'"):
        data.nope  # noqa: B018


def test_register_still_refuses_a_builtin_name():
    import vispos

    with pytest.raises(ValueError, match="config type 'Joiner' is already registered to"):
        vispos.register(dict, name="Joiner")
    with pytest.raises(ValueError, match="config type 'PositionEmbeddingSine' is already registered"):
        vispos.register(dict, name="PositionEmbeddingSine")


def test_load_command_names_every_subcommand():
    from vispos.app.cli import _parser, load_command

    choices = _parser()._subparsers._group_actions[0].choices
    for command in choices:
        assert callable(load_command(command))
    with pytest.raises(KeyError):
        load_command("nope")
