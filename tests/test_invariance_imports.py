"""vispos.invariance is used through its public surface: no module outside the package imports one
of its private (``_``-prefixed) modules, every name it exports is documented, and its
convolutional patch stem is traced by the package itself (nothing from a floor above hands it a
tracer at import).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vispos.invariance as invariance

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vispos"
INVARIANCE = "vispos.invariance"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, dotted name)`` for every import in ``source`` (the code of ``module``) that reaches
    a private module of :mod:`vispos.invariance`: absolute or relative, ``import``, ``from ...
    import`` (a private module imported by name included), at module level or inside a function,
    and ``importlib.import_module`` of a literal name."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [origin] + [f"{origin}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        for target in targets:
            parts = target.split(".")
            if parts[:2] == INVARIANCE.split(".") and any(part.startswith("_") for part in parts[2:]):
                found.append((node.lineno, target))
                break
    return found


def _outside_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if (PACKAGE / "invariance") not in p.parents)


def test_no_module_outside_invariance_imports_a_private_invariance_module():
    offenders = []
    for path in _outside_modules():
        module = _module_name(path)
        for line, target in _private_imports(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not offenders, "import these through vispos.invariance's public names instead:\n" + "\n".join(offenders)


def test_the_scan_covers_every_module_outside_the_package():
    names = {_module_name(p) for p in _outside_modules()}
    assert {"vispos.backbones.timm_backbone", "vispos.backbones._projections", "vispos.monai._decoder",
            "vispos.monai._anysize", "vispos.app.train.attention"} <= names
    assert not any(name.startswith(INVARIANCE + ".") for name in names)


@pytest.mark.parametrize("source, module, is_package, want", [
    ("from ..invariance.tracing._trace import trace_dual", "vispos.backbones.timm_backbone", False,
     "vispos.invariance.tracing._trace"),
    ("def f():\n    from ...invariance.tokens._tokens import item_grids", "vispos.app.train.attention", False,
     "vispos.invariance.tokens._tokens"),
    ("from .invariance.tokens import _stem", "vispos.config", False, "vispos.invariance.tokens._stem"),
    ("from ..invariance.geometry import _run", "vispos.monai", True, "vispos.invariance.geometry._run"),
    ("import vispos.invariance.tokens._packed as p", "vispos.levels", False, "vispos.invariance.tokens._packed"),
    ("import importlib\nimportlib.import_module('vispos.invariance.tracing._mode_graphs')", "vispos.levels", False,
     "vispos.invariance.tracing._mode_graphs"),
])
def test_the_scan_finds_each_form_of_a_private_import(source, module, is_package, want):
    assert [target for _, target in _private_imports(source, module, is_package)] == [want]


@pytest.mark.parametrize("source, module", [
    ("from ..invariance import make_graph_invariant, rule_for", "vispos.backbones.pyramid"),
    ("from ..invariance.rules import CellWise", "vispos.backbones._batch_norm"),
    ("from .._checks import check_int", "vispos.backbones._graph"),  # another package's private module
    ("import vispos.invariance", "vispos.levels"),
])
def test_the_scan_passes_public_imports(source, module):
    assert _private_imports(source, module) == []


def test_every_public_name_of_invariance_is_documented_and_public():
    for name in invariance.__all__:
        obj = getattr(invariance, name)
        assert not name.startswith("_"), name
        assert (obj.__doc__ or "").strip(), f"vispos.invariance.{name} has no docstring"
    assert set(invariance.__all__) >= {
        "make_padding_invariant", "make_graph_invariant", "trace_features", "InvariantRunner", "TokenRunner",
        "PackedRunner", "TokenModelRule", "InvariantProjection"}


def test_make_padding_invariant_is_built_on_the_public_rewrite_step(monkeypatch):
    """The public entry point and the adapters share one rewrite step: replacing it (as a user's
    wrapper or a test would) is seen by make_padding_invariant."""
    from torch import nn

    from vispos.invariance import _network

    calls = []
    real = _network.make_graph_invariant

    def spy(*args, **kwargs):
        calls.append(type(args[0]).__name__)
        return real(*args, **kwargs)

    monkeypatch.setattr(_network, "make_graph_invariant", spy)
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU()).double().eval()
    invariance.make_padding_invariant(net, probe_size=8)
    assert calls == ["Sequential"]


def test_the_convolutional_stem_is_traced_without_the_backbones_imported():
    """The stem's tracer lives in vispos.invariance: nothing registers it from vispos.backbones,
    and a convolutional patch stem runs with only vispos.invariance imported."""
    code = textwrap.dedent("""
        import sys
        import torch
        from torch import nn
        from timm.layers import PatchEmbed
        import vispos.invariance.tokens._stem as stem
        from vispos import NestedTensor
        from vispos.padding import Padding

        assert not hasattr(stem, "register_stem_tracer") and not hasattr(stem, "_TRACER")
        embed = PatchEmbed(img_size=32, patch_size=4, in_chans=1, embed_dim=4, dynamic_img_pad=True,
                           strict_img_size=False, output_fmt="NHWC", flatten=False).double().eval()
        embed.proj = nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.GroupNorm(2, 4), nn.ReLU(),
                                   nn.Conv2d(4, 4, 3, 2, 1)).double()
        projection = stem.invariant_stem(embed)
        assert stem.invariant_stem(embed) is projection  # kept on patch_embed, traced once
        x = torch.zeros(2, 1, 16, 16, dtype=torch.float64)
        x[0] = torch.randn(1, 16, 16, dtype=torch.float64)
        x[1, :, :8, :12] = torch.randn(1, 8, 12, dtype=torch.float64)
        padding = Padding.from_sizes([(16, 16), (8, 12)], (16, 16))
        with torch.no_grad():
            got = projection(NestedTensor(x, padding))
            alone = embed.proj(x[1:, :, :8, :12])
        assert got.padding.sizes == ((4, 4), (2, 3)), got.padding.sizes
        torch.testing.assert_close(got.tensors[1:, :, :2, :3], alone, rtol=1e-12, atol=1e-12)
        assert "vispos.backbones" not in sys.modules, "the stem's tracer imported the backbones"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
