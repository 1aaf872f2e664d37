"""The package's layout (issues 19 and 32): floors that imports only descend, no import circle,
each module one room of < 500 lines whose first docstring line names its concern, the library
core never importing the app side, and every import path that worked before a move still
working, with a ``DeprecationWarning`` that names the new home.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import os
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vispos"

#: modules at the old paths that only re-export the app side (issue 19 moved their contents;
#: since issue 32 importing them warns)
ALIASES = {"vispos/data.py", "vispos/viz.py", "vispos/cli.py"}

#: where each module lives, lowest floor first. A module may import its own floor and the ones
#: below, never a floor above (module-level and function-level imports alike). A subpackage's
#: modules share its floor; a new top-level module must be given one here.
#:
#: The transformer sits *below* the backbones: it consumes flattened levels
#: (:mod:`vispos.levels`, one floor down) and knows nothing of backbones, while the backbones
#: package still answers the transformer's old names (deprecated aliases). So the issue-32
#: import ``vispos.transformer`` -> ``vispos.backbones.joiner`` (for ``FlatLevels``) counts as
#: upward, as the issue says.
FLOORS: list[tuple[str, set[str]]] = [
    ("private core", {
        "vispos._checks", "vispos._tracing", "vispos._derived", "vispos._deprecation", "vispos._cache",
        "vispos._cache_switch", "vispos._cache_owner", "vispos._sincos", "vispos._sincos_lines",
        "vispos._lazy", "vispos._public", "vispos._suggest",
    }),
    ("padding and masks", {"vispos.padding"}),
    # DETR's position rule sits with the padded batches: the sine op of vispos.ops computes it
    ("padded batches", {"vispos.nested_tensor", "vispos.batching", "vispos.levels", "vispos._positions"}),
    ("fused ops", {"vispos.ops"}),
    ("padding invariance", {"vispos.invariance"}),
    ("encodings", {"vispos.encodings"}),
    ("transformer", {"vispos.transformer"}),
    ("backbones", {"vispos.backbones"}),
    ("integrations", {"vispos.monai", "vispos.keras"}),
    ("config and the public API", {"vispos.config", "vispos"}),
    ("app", {"vispos.app", "vispos.data", "vispos.viz", "vispos.cli"}),
]

#: the deprecated names each module answers (PEP 562, see vispos/_deprecation.py): old -> new home
DEPRECATED = {
    "vispos": {"apply_rotary": "vispos.encodings.rotary.apply_rotary_sincos"},
    "vispos.encodings": {"apply_rotary": "vispos.encodings.rotary.apply_rotary_sincos"},
    "vispos.encodings.rotary": {"apply_rotary": "vispos.encodings.rotary.apply_rotary_sincos"},
    "vispos.backbones": {
        "DetrEncoder": "vispos.transformer.DetrEncoder",
        "DetrEncoderLayer": "vispos.transformer.DetrEncoderLayer",
        "BackboneBase": "vispos.backbones.base.BackboneAdapter",
        "valid_ratios": "vispos.padding.mask_valid_ratios",
    },
    "vispos.backbones.base": {"BackboneBase": "vispos.backbones.base.BackboneAdapter"},
    "vispos.backbones.joiner": {"valid_ratios": "vispos.padding.mask_valid_ratios"},
    "vispos.padding": {
        "valid_ratios": "vispos.padding.mask_valid_ratios",
        "SpatialInput": "vispos.nested_tensor.SpatialInput",
    },
    "vispos.nested_tensor": {
        "nested_tensor_from_tensor_list": "vispos.batching.nested_tensor_from_tensor_list",
        "collate_fn": "vispos.batching.collate_fn",
        "PaddedCollate": "vispos.batching.PaddedCollate",
    },
}

#: public names importable before issue 19, by module (the old ``__all__`` lists, verbatim)
OLD_PUBLIC = {
    "vispos.data": [
        "MAX_IMAGE_PIXELS", "MAX_VOLUME_VOXELS", "IMAGENET_MEAN", "IMAGENET_STD", "SAMPLE_IMAGES",
        "imagenet_normalize", "load_image", "load_images", "sample_images", "VOLUME_NORMALIZATIONS",
        "normalize_intensity", "resize_volume", "load_volume", "load_volumes", "mni152_template",
        "sample_volumes",
    ],
    "vispos.viz": [
        "cosine_similarity_map", "query_cells", "plot_position_similarity", "plot_volume_similarity",
        "encode_grid", "channel_wavelengths", "plot_channels", "plot_sincos_curves", "plot_wavelengths",
        "plot_similarity", "plot_padded_batch", "plot_normalized_coords", "plot_rotary_invariance",
    ],
    "vispos.cli": ["main", "DEFAULT_CONFIG", "DEFAULT_VOLUME_CONFIG"],
    "vispos.backbones": [
        "Backbone", "BackboneBase", "SpatialPositionEmbedding", "DetrEncoder", "DetrEncoderLayer",
        "FlatLevels", "FrozenBatchNorm3d", "Joiner", "TimmBackbone", "TorchvisionBackbone",
        "VOLUME_MODELS", "VolumeBackbone", "backbone_border_effect", "flatten_levels",
        "format_load_report", "freeze_batch_norm", "load_checkpoint_state", "unflatten_levels",
        "valid_ratios",
    ],
}


#: modules still over the size limit, waiting for their owner's part of issue 19 (padcore:
#: the thin sine module and the Padding value object); remove an entry when it lands
OVERSIZED_PENDING: set[str] = set()  # padcore brought sine.py, nested_tensor.py and _sincos.py under 500


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _name(path: Path) -> str:
    """The dotted module name of ``path`` (a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in _modules()}


def _import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``path``: module level and inside functions (a function-level
    import is still a dependency, only a later one)."""
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _imported(path: Path) -> set[str]:
    """Absolute names ``path`` imports from vispos (relative imports resolved): for ``from m
    import a``, ``m.a`` when that is a module, else ``m`` (``a`` is an attribute of ``m``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]  # the package a relative import starts from (also for __init__.py)
    out = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        for alias in node.names:
            out.add(f"{name}.{alias.name}" if f"{name}.{alias.name}" in MODULES else name)
    return {n for n in out if n == "vispos" or n.startswith("vispos.")}


def _module_deps(path: Path) -> set[str]:
    """The vispos *modules* ``path`` imports: each imported name mapped to the longest module
    it names (``from .padding import Padding`` -> ``vispos.padding``), itself left out."""
    deps = set()
    for name in _imported(path):
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name:
            deps.add(name)
    return deps - {_name(path)}


def _floor(module: str) -> int:
    for level, (_, members) in enumerate(FLOORS):
        for member in members:
            if module == member or (member != "vispos" and module.startswith(member + ".")):
                return level
    raise AssertionError(f"{module} has no floor: add it to FLOORS in tests/test_layout.py")


def _graph() -> dict[str, set[str]]:
    return {name: _module_deps(path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_floor():
    for name in MODULES:
        _floor(name)


def test_no_import_circles():
    """No two vispos modules import each other, directly or through others (issue 32 found
    ``_masks`` <-> ``_masks_host`` and ``nested_tensor`` <-> ``batching``)."""
    assert _cycles(_graph()) == []


def test_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_flow_down(module):
    """A module imports only its own floor and the floors below (issue 32: ``transformer`` ->
    ``backbones.joiner`` for ``FlatLevels``; the shared thing moved down to ``vispos.levels``)."""
    level = _floor(module)
    upward = sorted(
        f"{dep} ({FLOORS[_floor(dep)][0]})" for dep in _module_deps(MODULES[module]) if _floor(dep) > level
    )
    assert not upward, f"{module} ({FLOORS[level][0]}) imports from a higher floor: {upward}"


def test_floor_rule_catches_the_issue_32_imports():
    """The rules above fail on the imports issue 32 found (so they can fail at all)."""
    graph = _graph()
    assert _floor("vispos.transformer") < _floor("vispos.backbones.joiner")
    assert _cycles({**graph, "vispos.padding._masks_host": graph["vispos.padding._masks_host"] | {"vispos.padding._masks"}})
    assert _cycles({**graph, "vispos.nested_tensor": graph["vispos.nested_tensor"] | {"vispos.batching"}})


@pytest.mark.parametrize("path", [p for p in _modules() if "app" not in p.relative_to(PACKAGE).parts],
                         ids=_rel)
def test_core_never_imports_the_app_side(path):
    if _rel(path) in ALIASES:
        return
    upward = sorted(n for n in _imported(path) if n == "vispos.app" or n.startswith("vispos.app."))
    assert not upward, f"{_rel(path)} (library core) imports the app side: {upward}"


def test_import_vispos_loads_no_app_module_and_warns_nothing():
    code = (
        "import warnings; warnings.filterwarnings('error', '.*is deprecated and will be removed');"
        "import sys, vispos, vispos.backbones, vispos.config, vispos.encodings, vispos.transformer, vispos.levels;"
        "print(sorted(m for m in sys.modules if m.startswith('vispos.app') or m in "
        "('vispos.data', 'vispos.viz', 'vispos.cli', 'matplotlib')))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _resolve(dotted: str):
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("module", sorted(OLD_PUBLIC))
def test_old_import_paths_still_work(module):
    """Every name importable before issue 19 still imports; a deprecated one warns, naming its
    new home, and is the new object; the others are in ``__all__`` and do not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the alias modules warn on import
        mod = importlib.import_module(module)
    deprecated = DEPRECATED.get(module, {})
    for name in OLD_PUBLIC[module]:
        if name in deprecated:
            with pytest.warns(DeprecationWarning, match=rf"{module}\.{name} is deprecated.*use {deprecated[name]}"):
                exec(f"from {module} import {name} as got", space := {})
            assert space["got"] is _resolve(deprecated[name])
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", DeprecationWarning)
                exec(f"from {module} import {name}", {})
    assert set(OLD_PUBLIC[module]) - set(deprecated) <= set(mod.__all__)
    assert not set(deprecated) & set(mod.__all__)


def test_every_registered_alias_is_listed_and_warns():
    """Each deprecated attribute the package registers (vispos/_deprecation.py) is in
    :data:`DEPRECATED`, warns naming its new home, and resolves to it."""
    from vispos import _deprecation

    for name in MODULES:
        if not name.startswith(("vispos.app", "vispos.data", "vispos.viz", "vispos.cli", "vispos.keras")):
            importlib.import_module(name)
    registered = {}
    for (module, old), new in _deprecation.ALIASES.items():
        registered.setdefault(module, {})[old] = new.replace(":", ".")
    assert registered == DEPRECATED
    for module, names in DEPRECATED.items():
        for old, new in names.items():
            with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is deprecated.*use {new} instead") as record:
                got = getattr(importlib.import_module(module), old)
            assert got is _resolve(new)
            assert record[0].filename == __file__  # attributed to the caller's line
    with pytest.raises(AttributeError, match="has no attribute 'NotAThing'"):
        importlib.import_module("vispos.backbones").NotAThing  # noqa: B018


@pytest.mark.parametrize("old, new", [
    ("vispos.viz", "vispos.app.figures"), ("vispos.data", "vispos.app.data"), ("vispos.cli", "vispos.app.cli"),
])
def test_old_modules_warn_naming_their_new_home(old, new):
    """Importing an alias module warns once, at the importing line (a fresh interpreter: the
    module is imported only once per process)."""
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        f"    import {old}\n"
        "print([(str(x.category.__name__), str(x.message), x.filename) for x in w])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    record = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    ours = [r for r in record if r[1].startswith(old)]
    assert len(ours) == 1 and ours[0][0] == "DeprecationWarning", record
    assert f"{old} is deprecated" in ours[0][1] and new in ours[0][1] and ours[0][2] == "<string>"


def test_viz_alias_carries_every_name_of_its_modules():
    """``vispos.viz`` claims to alias :mod:`vispos.app.figures` and :mod:`vispos.app.png`: every
    public name of both (issue 32: it lacked the vision-RoPE figures, the per-level similarity
    figures and the PNG writers)."""
    import vispos.app.figures
    import vispos.app.png

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import vispos.viz
    expected = set(vispos.app.figures.__all__) | set(vispos.app.png.__all__)
    assert set(vispos.viz.__all__) == expected
    for name in expected:
        home = vispos.app.figures if name in vispos.app.figures.__all__ else vispos.app.png
        assert getattr(vispos.viz, name) is getattr(home, name)


def test_old_paths_are_the_new_objects():
    import vispos.app.cli
    import vispos.app.data
    import vispos.app.figures
    import vispos.app.png

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import vispos.cli
        import vispos.data
        import vispos.viz

    assert vispos.data.load_image is vispos.app.data.load_image
    assert vispos.viz.plot_similarity is vispos.app.figures.plot_similarity
    assert vispos.viz.plot_position_similarity is vispos.app.png.plot_position_similarity
    assert vispos.cli.main is vispos.app.cli.main


PACKAGES = sorted(n for n, p in MODULES.items() if p.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGES)
def test_package_namespace_is_its_all(package):
    """A package shows exactly its ``__all__`` and its submodules: no helper it imported for
    itself (issue 32: ``vispos.backbones`` exported ``typing.Any``), and every ``__all__`` name
    resolves."""
    if package == "vispos.keras" or (package.startswith("vispos.monai") and importlib.util.find_spec("monai") is None):
        pytest.skip("optional extra")
    mod = importlib.import_module(package)
    public = set(getattr(mod, "__all__", ()))
    missing = sorted(n for n in public if not hasattr(mod, n))
    assert not missing, f"{package}.__all__ names what it does not have: {missing}"
    leaks = sorted(
        n for n, v in vars(mod).items()
        if not n.startswith("_") and n not in public
        and not (isinstance(v, types.ModuleType) and v.__name__ == f"{package}.{n}")
    )
    assert not leaks, f"{package} shows names outside its __all__: {leaks}"


def test_console_script_and_module_entry_points():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    target = cfg["options.entry_points"]["console_scripts"].strip()
    name, _, ref = (s.strip() for s in target.partition("="))
    assert name == "vispos"
    module, _, attr = ref.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for mod in ("vispos.cli", "vispos.app.cli"):  # the old and the new `python -m` paths
        out = subprocess.run([sys.executable, "-m", mod, "--help"], capture_output=True, text=True, env=env)
        assert out.returncode == 0 and "usage: vispos" in out.stdout, (mod, out.stderr)
        assert ("vispos.cli is deprecated" in out.stderr) == (mod == "vispos.cli"), out.stderr


@pytest.mark.parametrize("path", _modules(), ids=_rel)
def test_each_module_is_one_room(path):
    """Under 500 lines, and a module docstring whose first line names one concern."""
    lines = path.read_text().count("\n")
    if _rel(path) not in OVERSIZED_PENDING:
        assert lines < 500, f"{_rel(path)} has {lines} lines (rooms stay under 500)"
    else:
        assert lines >= 500, f"{_rel(path)} is down to {lines} lines: remove it from OVERSIZED_PENDING"
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and doc.strip(), f"{_rel(path)} has no module docstring"


def test_public_names_are_written_once():
    """``vispos.__all__`` and ``vispos.encodings.__all__`` are read from :mod:`vispos._public`
    (before, the list was written three times: ``vispos/__init__.py``, ``vispos/_api.py`` and
    ``vispos/encodings/__init__.py``); no other module writes a name list of its own."""
    import vispos
    import vispos.encodings
    from vispos import _public

    assert vispos.__all__ == list(_public.TOP_LEVEL)
    assert vispos.encodings.__all__ == list(_public.ENCODINGS)
    assert not (PACKAGE / "_api.py").exists()
    for name in ("__init__.py", "encodings/__init__.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        lists = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
        assert all(not isinstance(n.value, (ast.List, ast.Tuple)) for n in lists), name


#: files whose history line is removed on their owner's branch (drop an entry when it lands)
_HISTORY = re.compile(r"\bissues?\s+#?[0-9]+", re.IGNORECASE)


@pytest.mark.parametrize("path", [*_modules(), ROOT / "README.md"], ids=_rel)
def test_no_history_in_code_or_readme(path):
    """The project's history (which issue brought what) lives in CHANGELOG.md, not in code
    comments, docstrings or the README (a peer's issue is cited as ``owner/repo#N``)."""
    hits = [m.group(0) for m in _HISTORY.finditer(path.read_text())]
    assert not hits, f"{_rel(path)} cites issues: {hits}"


#: the seven modules of the padding truth: one package, nothing of them left beside it
PADDING_ROOMS = ("_mask_checks", "_mask_origin", "_mask_resize", "_mask_views", "_masks", "_masks_host")
#: the Padding value itself, its room in the package (its public home is the package)
PADDING_VALUE = "_value"


def test_the_padding_truth_is_one_package():
    """``vispos.padding`` is a package holding the Padding value and its mask algorithms (before:
    seven top-level modules, ``padding.py`` and six ``_mask*`` rooms); the public imports work and
    so do pickles written before the move."""
    assert (PACKAGE / "padding" / "__init__.py").is_file() and not (PACKAGE / "padding.py").exists()
    for room in PADDING_ROOMS:
        assert (PACKAGE / "padding" / f"{room}.py").is_file() and not (PACKAGE / f"{room}.py").exists(), room
    import vispos
    from vispos.padding import Padding, check_mask, mask_valid_ratios

    assert vispos.Padding is Padding
    assert callable(check_mask) and callable(mask_valid_ratios)
    import pickle

    import torch

    import vispos.padding
    from vispos.padding import _value

    value = Padding.from_sizes([(3, 4), (2, 4)], (3, 4))
    assert torch.equal(pickle.loads(pickle.dumps(value)).mask, value.mask)
    # a pickle written when the value lived in vispos/padding.py names vispos.padding._restore
    assert value.__reduce__()[0] is _value._restore is vispos.padding._restore
    rooms = {"__init__.py", f"{PADDING_VALUE}.py", *(f"{r}.py" for r in PADDING_ROOMS)}
    assert {p.name for p in (PACKAGE / "padding").glob("*.py")} == rooms
