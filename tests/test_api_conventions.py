"""One API, not four dialects (issue 32): every public encoder's size argument follows vispos' rule
(``dim``) or is listed as mirroring a peer, in the one table of ``docs/api-conventions.md``;
a drop-in keeps its peer's names and, where the table says so, its argument order (checked
against the peer's installed package, or its published signature where it is not a package);
look-alike pairs say in their docstrings how they differ.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch

import vispos
import vispos.encodings

DOC = Path(__file__).resolve().parents[1] / "docs" / "api-conventions.md"

#: every parameter name that means "a width" in vispos or its peers
WIDTH_NAMES = {
    "num_pos_feats", "channels", "d_model", "dim", "embed_dim", "head_dim", "hidden_dim",
    "embedding_dim", "encoding_dim", "hidden_size", "num_feats", "feat_dim", "emb_dim",
    "num_channels", "d_embed", "model_dim", "n_embd", "num_position_features",
}
#: the rule for an encoder that mirrors no peer: its width is ``dim``; a width per axis or per
#: coordinate inside it is ``num_pos_feats``, a hidden layer's ``hidden_dim``
RULE_PRIMARY = "dim"
RULE_NAMES = {"dim", "num_pos_feats", "hidden_dim"}

#: the peers' own signatures, for the drop-ins: an importable object (its signature is read),
#: or the parameter names of a peer that is not a package, from its source. ``order``: the
#: table promises the peer's argument order (positional arguments mean the same in both).
PEERS = {
    "PositionEmbeddingSine": (  # DETR models/position_encoding.py
        ("num_pos_feats", "temperature", "normalize", "scale"), True),
    "PositionEmbeddingLearned": (("num_pos_feats",), True),  # DETR models/position_encoding.py
    "PositionEmbeddingSineDepthAdded": (  # Mask2Former mask2former_video/.../position_encoding.py
        ("num_pos_feats", "temperature", "normalize", "scale"), True),
    "dino_sine": (  # DINO models/dino/position_encoding.py, PositionEmbeddingSineHW
        ("num_pos_feats", "temperatureH", "temperatureW", "normalize", "scale"), False),
    "mae_sincos_2d": (("embed_dim", "grid_size", "cls_token"), True),  # MAE util/pos_embed.py
    "sine_embed_coords": (  # detrex detrex/layers/position_embedding.py, get_sine_pos_embed
        ("pos_tensor", "num_pos_feats", "temperature", "exchange_xy"), True),
    "SpeechainPositionalEncoding": (  # speechain module/transformer/pos_enc.py
        ("posenc_type", "d_model", "emb_scale", "emb_layernorm", "posenc_scale", "init_alpha",
         "max_len", "dropout"), True),
    "PositionalEncoding1D": ("positional_encodings.torch_encodings.PositionalEncoding1D", True),
    "PositionalEncoding2D": ("positional_encodings.torch_encodings.PositionalEncoding2D", True),
    "PositionalEncoding3D": ("positional_encodings.torch_encodings.PositionalEncoding3D", True),
    "PositionalEncodingPermute1D": ("positional_encodings.torch_encodings.PositionalEncodingPermute1D", True),
    "PositionalEncodingPermute2D": ("positional_encodings.torch_encodings.PositionalEncodingPermute2D", True),
    "PositionalEncodingPermute3D": ("positional_encodings.torch_encodings.PositionalEncodingPermute3D", True),
    "resample_abs_pos_embed": ("timm.layers.resample_abs_pos_embed", True),
    "apply_rot_embed_cat": ("timm.layers.apply_rot_embed_cat", True),
    "timm_sincos_2d": ("timm.layers.build_sincos2d_pos_embed", True),
    "DinoV3RotaryEmbedding": ("timm.layers.pos_embed_sincos.RotaryEmbeddingDinoV3", True),
    "MixedRotaryEmbedding": ("timm.layers.pos_embed_sincos.RotaryEmbeddingMixed", True),
    "init_mixed_freqs": ("timm.layers.pos_embed_sincos.init_random_2d_freqs", True),
    "monai_sincos": ("monai.networks.blocks.pos_embed_utils.build_sincos_position_embedding", True),
    "RotaryEmbedding": ("rotary_embedding_torch.RotaryEmbedding", False),
    # drop-ins added beside this test (issue 32, the rff engineer); checked once they exist
    "PositionEmbeddingRandom": ("segment_anything.modeling.prompt_encoder.PositionEmbeddingRandom", True),
    "monai_fourier": ("monai.networks.blocks.pos_embed_utils.build_fourier_position_embedding", True),
    "rtdetr_sincos_2d": ("transformers.models.rt_detr.modeling_rt_detr.build_2d_sinusoidal_position_embedding", True),
}


def _table(heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first table after ``## heading`` in the docs page."""
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def _encoder_rows() -> dict[str, tuple[set[str], str]]:
    """name -> (size argument names, mirrors) from the table."""
    out = {}
    for cells in _table("Encoders and their size argument"):
        assert len(cells) == 4, cells
        name = re.fullmatch(r"`(\w+)`", cells[0])
        assert name, f"first cell must be one `name`: {cells[0]!r}"
        assert name.group(1) not in out, f"{name.group(1)} has two rows"
        sizes = set(re.findall(r"`(\w+)`", cells[2])) if cells[2] != "—" else set()
        out[name.group(1)] = (sizes, cells[3])
    return out


def _public_encoders() -> dict[str, object]:
    """Every public callable of ``vispos.encodings``, and of ``vispos`` where it is defined in
    ``vispos.encodings`` (the encoders; ``vispos`` also exports batches, paddings, caches)."""
    out = {name: getattr(vispos.encodings, name) for name in vispos.encodings.__all__}
    for name in vispos.__all__:
        obj = getattr(vispos, name)
        if callable(obj) and getattr(obj, "__module__", "").startswith("vispos.encodings"):
            out[name] = obj
    return {name: obj for name, obj in out.items() if callable(obj)}


def _params(obj) -> list[inspect.Parameter]:
    return list(inspect.signature(obj).parameters.values())


def _widths(obj) -> set[str]:
    return {p.name for p in _params(obj) if p.name in WIDTH_NAMES}


def _positional(obj) -> list[str]:
    return [p.name for p in _params(obj) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_the_table_lists_every_public_encoder_once():
    rows, public = _encoder_rows(), _public_encoders()
    assert sorted(set(public) - set(rows)) == [], "public encoders missing from docs/api-conventions.md"
    assert sorted(set(rows) - set(public)) == [], "rows naming no public encoder"


@pytest.mark.parametrize("name", sorted(_public_encoders()))
def test_size_argument_follows_the_rule_or_mirrors_a_peer(name):
    obj = _public_encoders()[name]
    sizes, mirrors = _encoder_rows()[name]
    widths = _widths(obj)
    assert widths == sizes, f"{name} takes width arguments {sorted(widths)}, the table says {sorted(sizes)}"
    if mirrors == "—":  # vispos' own: the rule
        assert widths <= RULE_NAMES, f"{name} mirrors no peer, so its widths must be among {RULE_NAMES}: {widths}"
        assert not widths or RULE_PRIMARY in widths, f"{name}'s width must be called {RULE_PRIMARY!r}: {widths}"
    else:
        assert mirrors.strip(), f"{name}: name the peer it mirrors"


def _peer_params(spec) -> list[str] | None:
    if isinstance(spec, tuple):
        return list(spec)
    module, _, attr = spec.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None
    return [p.name for p in _params(obj) if p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL]


@pytest.mark.parametrize("name", sorted(n for n in PEERS if n in _public_encoders()))
def test_drop_ins_keep_their_peers_names_and_order(name):
    """The width keeps the peer's name and position; where the table promises the peer's order
    (the presets among them: each mirrors its peer's function exactly), every positional
    argument means the same in both."""
    spec, order = PEERS[name]
    peer = _peer_params(spec)
    if peer is None:
        pytest.skip(f"{spec} is not installed")
    ours = _positional(_public_encoders()[name])
    for width in _widths(_public_encoders()[name]) - {"hidden_dim"}:
        if width in peer:
            assert ours.index(width) == peer.index(width), (name, width, ours, peer)
    sizes, mirrors = _encoder_rows()[name]
    assert mirrors != "—", f"{name} has a peer: its row must name it"
    if order:
        common = min(len(ours), len(peer))
        assert ours[:common] == peer[:common], f"{name}{ours} vs its peer {peer}"
        assert "same order" in mirrors or "(" in mirrors, f"{name}: the table must show the peer's order"


#: a peer's parameters a drop-in takes by keyword only, or not at all, each with its reason
NOT_IN_ORDER = {
    # vispos' extras are keyword-only at the end (the docs' decision for the presets)
    ("timm_sincos_2d", "device"), ("timm_sincos_2d", "dtype"),
    ("init_mixed_freqs", "device"), ("init_mixed_freqs", "dtype"),
}
NOT_TAKEN = {
    # rotary-embedding-torch's language-model options (xpos, learned or custom frequencies,
    # caching, layout); the table promises its names for dim and theta only
    ("RotaryEmbedding", name) for name in (
        "custom_freqs", "freqs_for", "max_freq", "num_freqs", "learned_freq", "use_xpos",
        "xpos_scale_base", "interpolate_factor", "theta_rescale_factor", "seq_before_head_dim",
        "cache_if_possible", "cache_max_seq_len")
} | {
    # DINO's PositionEmbeddingSineHW: dino_sine is a preset of its settings (one temperature)
    ("dino_sine", name) for name in ("temperatureH", "temperatureW", "normalize", "scale")
}


@pytest.mark.parametrize("name", sorted(n for n in PEERS if n in _public_encoders()))
def test_drop_ins_take_every_peer_keyword_and_position(name):
    """A call written for the peer runs unchanged: each of the peer's parameters is a parameter
    of ours by the same name (a keyword works), and where the table promises the peer's order,
    at the same position (a positional call means the same), except the listed, reasoned gaps."""
    spec, order = PEERS[name]
    peer = _peer_params(spec)
    if peer is None:
        pytest.skip(f"{spec} is not installed")
    params = inspect.signature(_public_encoders()[name]).parameters
    missing = [p for p in peer if (name, p) not in NOT_TAKEN and (
        p not in params or params[p].kind is inspect.Parameter.POSITIONAL_ONLY)]
    assert missing == [], f"{name} does not take its peer's keyword(s) {missing}"
    if order:
        ours = _positional(_public_encoders()[name])
        moved = [(i, p) for i, p in enumerate(peer)
                 if (name, p) not in NOT_IN_ORDER | NOT_TAKEN and (ours[i] if i < len(ours) else None) != p]
        assert moved == [], f"{name}'s positions differ from its peer's at {moved}: {ours} vs {peer}"


def test_detrex_call_runs_unchanged():
    """detrex's ``get_sine_pos_embed(pos_tensor, num_pos_feats=128, temperature=10000,
    exchange_xy=True)``, by keyword and by position."""
    boxes = torch.rand(2, 3, 4)
    by_name = vispos.sine_embed_coords(pos_tensor=boxes, num_pos_feats=128, temperature=10000, exchange_xy=False)
    assert torch.equal(vispos.sine_embed_coords(boxes, 128, 10000, False), by_name)
    assert by_name.shape == (2, 3, 512)


def test_presets_mirror_their_peers_order_as_documented():
    """The docs' decision: each preset takes its peer's own order (so three orders)."""
    assert _positional(vispos.timm_sincos_2d)[:2] == ["feat_shape", "dim"]
    assert _positional(vispos.mae_sincos_2d)[:2] == ["embed_dim", "grid_size"]
    assert _positional(vispos.monai_sincos)[:2] == ["grid_size", "embed_dim"]
    text = DOC.read_text()
    assert "each preset mirrors its peer's function exactly" in text


def test_rule_test_fails_on_a_dialect():
    """The check above can fail: an own encoder calling its width ``d_model`` breaks the rule."""

    def own(x, d_model: int = 8):  # pragma: no cover - only its signature is read
        """An imaginary vispos encoder."""

    assert _widths(own) == {"d_model"} and not _widths(own) <= RULE_NAMES


# ------------------------------------------------------------------------- look-alike pairs
PAIRS = [
    ("collate_fn", "PaddedCollate"),
    ("apply_rotary_sincos", "apply_rot_embed_cat"),
    ("Backbone", "BackboneAdapter"),
    ("mask_valid_ratios", "Padding.valid_ratios"),
]


def _resolve(name: str):
    import vispos.backbones
    import vispos.padding

    head, _, attr = name.partition(".")
    for module in (vispos, vispos.backbones, vispos.padding):
        if hasattr(module, head):
            obj = getattr(module, head)
            return getattr(obj, attr) if attr else obj
    raise AssertionError(name)


@pytest.mark.parametrize("a, b", PAIRS)
def test_look_alike_pairs_are_plainly_different(a, b):
    """Each docstring names its look-alike and the two first lines differ; the docs' pair table
    lists the pair (issue 32)."""
    doc_a, doc_b = (inspect.getdoc(_resolve(n)) or "" for n in (a, b))
    assert doc_a.splitlines()[0] != doc_b.splitlines()[0]
    short = lambda n: n.rpartition(".")[2]  # noqa: E731
    assert short(b) in doc_a or b in doc_a, f"{a}'s docstring does not say how it differs from {b}"
    assert short(a) in doc_b or a in doc_b, f"{b}'s docstring does not say how it differs from {a}"
    listed = {cells[0] for cells in _table("Look-alike pairs")}
    assert any(f"`{a.split('.')[0]}" in cell and f"`{b.split('.')[0]}" in cell for cell in listed), (a, b)


def test_collate_fn_is_padded_collate_with_defaults():
    from vispos import PaddedCollate, collate_fn

    batch = [(torch.ones(3, 4, 5), {"a": 1}), (torch.ones(3, 6, 2), None)]
    nt, targets = collate_fn(batch)
    ref, ref_targets = PaddedCollate()(batch)
    assert torch.equal(nt.tensors, ref.tensors) and torch.equal(nt.mask, ref.mask) and targets == ref_targets
    rounded, _ = PaddedCollate(size_divisibility=4, pad_value=0.5)(batch)
    assert rounded.tensors.shape[-2:] == (8, 8) and rounded.tensors[0, 0, -1, -1] == 0.5


# ------------------------------------------------------------------ one word per concept
#: the public modules whose names the vocabulary covers
VOCABULARY_MODULES = (
    "vispos", "vispos.encodings", "vispos.backbones", "vispos.padding", "vispos.nested_tensor",
    "vispos.invariance", "vispos.monai", "vispos.levels", "vispos.batching", "vispos.transformer",
)
#: vispos' words (docs/api-conventions.md, "One word per concept") and the synonyms that only a
#: listed drop-in may use
VOCABULARY = {"num_axes", "spatial", "sizes", "size", "normalize", "frame"}
SYNONYMS = {
    # the number of spatial axes
    "spatial_dims", "n_spatial", "n_axes", "num_spatial_dims", "spatial_ndim", "ndim_spatial", "n_dims",
    "num_dims",
    # a spatial shape, or each item's sizes
    "image_size", "image_sizes", "img_size", "grid_size", "grid_shape", "feat_shape", "feat_size",
    "padded_size", "spatial_shape", "spatial_size", "spatial_shapes", "spatial_shapes_list",
    "input_shape", "input_size", "height", "width",
    # the random Fourier features' frame
    "normalize_coords",
}


def _public_objects():
    """``qualname -> object`` for every public name of :data:`VOCABULARY_MODULES`."""
    out = {}
    for module_name in VOCABULARY_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or callable(obj):
                out.setdefault(name, obj)
    return out


def _deprecated_alias(value) -> str | None:
    """The new name a :func:`vispos._deprecation.renamed_attribute` property serves, else None."""
    return getattr(getattr(value, "fget", None), "__deprecated_alias__", None)


def _words(obj) -> set[str]:
    """Every parameter, attribute and method-parameter name ``obj`` shows (its signature; for a
    class, its and its vispos bases' attributes, annotations and public methods' parameters; an
    encoder's instance attributes too when it builds without arguments), without deprecated
    aliases."""

    def params(f) -> set[str]:
        try:
            return set(inspect.signature(f).parameters) - {"self", "cls"}
        except (TypeError, ValueError):
            return set()

    if not inspect.isclass(obj):
        return params(obj)
    words = set()
    for klass in obj.__mro__:
        if not klass.__module__.startswith("vispos"):
            continue
        words |= set(getattr(klass, "__annotations__", {}))
        for attr, value in vars(klass).items():
            if attr.startswith("_") and attr not in ("__init__", "__call__") or _deprecated_alias(value):
                continue
            words.add(attr) if not attr.startswith("_") else None
            if callable(value) or isinstance(value, (classmethod, staticmethod)):
                words |= params(getattr(value, "__func__", value))
    if obj.__module__.startswith("vispos.encodings"):
        try:
            words |= {a for a in vars(obj()) if not a.startswith("_")}
        except TypeError:  # a required argument: its signature is enough
            pass
    return words


def _drop_in_words() -> dict[str, set[str]]:
    """name -> the peer's words it keeps, from the docs' drop-in table."""
    out = {}
    for cells in _table("Drop-ins and the peers' words they keep"):
        assert len(cells) == 4, cells
        name = re.fullmatch(r"`(\w+)`", cells[0])
        assert name and name.group(1) not in out, cells[0]
        out[name.group(1)] = set(re.findall(r"`(\w+)`", cells[1]))
    return out


def _strays(objects: dict[str, object], allowed: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(name, word)`` for every synonym a public object uses that its drop-in row does not list."""
    return sorted((name, w) for name, obj in objects.items() for w in _words(obj) & SYNONYMS
                  if w not in allowed.get(name, set()))


def test_the_vocabulary_table_names_each_word_once():
    rows = _table("One word per concept: axes, shapes, `normalize`")
    words = [re.fullmatch(r"`(\w+)`.*", cells[1]).group(1) for cells in rows]
    assert sorted(words) == sorted(VOCABULARY), words
    for cells in rows:  # the "Not" column lists synonyms the test knows
        assert set(re.findall(r"`(\w+)`", cells[3])) <= SYNONYMS | {"normalize"}, cells[3]


def test_public_names_use_one_word_per_concept():
    """No public class, function, parameter or attribute uses a synonym of vispos' words, except
    the drop-ins in the docs' table, each for the words listed there (its peer's)."""
    assert _strays(_public_objects(), _drop_in_words()) == []


def test_drop_in_rows_are_not_stale():
    """Each row's words are words its object really uses (so the list cannot grow by habit)."""
    objects = _public_objects()
    for name, words in _drop_in_words().items():
        assert name in objects, f"{name} is not a public name"
        assert words <= _words(objects[name]), f"{name} does not use {sorted(words - _words(objects[name]))}"


def _non_bool_normalize(objects: dict[str, object]) -> list[str]:
    """The names whose ``normalize`` parameter is not a bool (annotation and default)."""
    out = []
    for name, obj in objects.items():
        try:
            param = inspect.signature(obj).parameters.get("normalize")
        except (TypeError, ValueError):
            continue
        if param is not None and not ("bool" in str(param.annotation) and isinstance(param.default, bool)):
            out.append(name)
    return out


def test_normalize_is_a_bool_wherever_it_is_taken():
    """``normalize`` means one thing: DETR's bool (divide by the valid extent)."""
    objects = _public_objects()
    assert _non_bool_normalize(objects) == []
    assert {"PositionEmbeddingSine", "cumulative_positions"} <= {
        n for n, o in objects.items() if "normalize" in _words(o)}


def test_vocabulary_test_fails_on_a_stray_synonym():
    """A new public class or function that says ``spatial_dims`` (or keeps an ``n_spatial``
    attribute, or a ``grid_shape`` method argument) is caught; its drop-in row would allow it."""

    class Stray(torch.nn.Module):
        """An imaginary public encoder."""

        n_spatial = 2

        def __init__(self, spatial_dims: int = 2) -> None:
            super().__init__()

        def forward(self, x, grid_shape=None):  # pragma: no cover - only its signature is read
            return x

    def stray(mask, normalize: str = "item"):  # pragma: no cover - only its signature is read
        """An imaginary public function."""

    Stray.__module__ = stray.__module__ = "vispos.encodings.stray"
    found = _strays({"Stray": Stray, "stray": stray}, {})
    assert found == [("Stray", "grid_shape"), ("Stray", "n_spatial"), ("Stray", "spatial_dims")]
    assert _strays({"Stray": Stray}, {"Stray": {"grid_shape", "n_spatial", "spatial_dims"}}) == []
    assert _non_bool_normalize({"Stray": Stray, "stray": stray}) == ["stray"]


def test_a_documented_name_not_in_vispos_says_where_it_is_imported_from():
    """Every name of the encoder table, and ``parse_spatial_input`` in concepts.md, is importable
    from ``vispos`` or its page says ``from HOME import NAME`` (and that import works). Before:
    both were documented bare, and ``vispos.cumulative_positions`` is an AttributeError."""
    pages = {DOC: sorted(_encoder_rows()), DOC.parent / "concepts.md": ["parse_spatial_input"]}
    for page, names in pages.items():
        text = page.read_text()
        for name in names:
            if name in vispos.__all__:
                continue
            homes = re.findall(rf"from (vispos[\w.]*) import {name}\b", text)
            assert homes, f"{page.name}: {name} is not in vispos.__all__ and the page does not say where it lives"
            for home in homes:
                assert callable(getattr(importlib.import_module(home), name)), (page.name, home, name)
