"""The docs show the code's signatures: every ``Name(...)`` in inline code of ``docs/**/*.md``
that names a vispos callable is read and compared with ``inspect.signature``.

Two kinds of spans are told apart:

* a **signature** (``Joiner(backbone, position_embedding, hidden_dim=None, ...)``): it starts at
  the first parameter, its bare names are the parameters at their positions and its defaults
  are the real ones. It must list every parameter in order, or say ``...`` where it leaves
  some out (then the names it shows must appear in that order);
* a **call** (``PositionEmbeddingSine(128, normalize=True)``): it must bind to the signature
  (no unknown keyword, not too many positional arguments).

Names that are not vispos' (torch, peers, a variable in the text) are skipped; one close to a
public vispos name fails unless :data:`NOT_VISPOS` lists it (a misspelling is not skipped). The fenced code
blocks are run by ``tests/test_docs_code.py``.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from pathlib import Path

import pytest

import vispos

DOCS = Path(__file__).resolve().parents[1] / "docs"
SPAN = re.compile(r"`([A-Za-z_][\w.]*)\(([^`]*)\)`", re.S)

#: names close to a vispos name that are a peer's
NOT_VISPOS = {
    "SinusoidalPositionEncoder",  # fairseq2's, in the migration guide
    "TFSummer",  # vispos.keras', not imported here (Keras is an optional extra)
}
#: methods and variables the docs name without their class: what they stand for
STANDS_FOR = {
    "get_embed": "DinoV3RotaryEmbedding.get_embed",
    "rope.padded": "DinoV3RotaryEmbedding.padded",
    "model.rope.padded": "DinoV3RotaryEmbedding.padded",
    "joiner.flatten": "Joiner.flatten",
    "module.cache_info": "PositionEmbeddingSine.cache_info",
    "pos": "PositionEmbeddingSine.forward",
    "forward": "PositionEmbeddingSine.forward",
}
#: deprecated keywords a page shows on purpose (the migration table): (callable, keyword)
DEPRECATED_SHOWN = {
    ("SinusoidalPositionalEncoding", "d_model"), ("LearnableSinusoidalPositionalEncoding", "d_model"),
    ("resample_abs_pos_embed", "mode"), ("sine_embed_coords", "coords"), ("sine_embed_coords", "swap_xy"),
    ("PositionEmbeddingLearned", "spatial_dims"), ("freeze_batch_norm", "n_spatial"),
    ("parse_spatial_input", "n_spatial"), ("backbone_border_effect", "padded_size"),
    ("resize_image_sizes", "image_sizes"), ("PositionEmbeddingRandom", "normalize"),
    ("SamPositionalEmbedding", "normalize"),
}
#: in api-conventions.md the "Mirrors" column shows the *peer's* signature under the peer's name
PEER_COLUMNS = {"api-conventions.md"}


def _resolve(name: str):
    import vispos.backbones
    import vispos.config
    import vispos.encodings
    import vispos.monai
    import vispos.nested_tensor
    import vispos.padding

    name = STANDS_FOR.get(name, name).removeprefix("vispos.")
    head, *rest = name.split(".")
    for home in (vispos, vispos.encodings, vispos.backbones, vispos.monai, vispos.padding, vispos.nested_tensor, vispos.config):
        obj = getattr(home, head, None)
        if obj is not None and not inspect.ismodule(obj):
            for attr in rest:
                obj = getattr(obj, attr, None)
            return obj if callable(obj) else None
    return None


def _spans():
    """``(page, line, name, args text)`` for every ``Name(...)`` in inline code (in
    api-conventions.md not the tables' "Mirrors" cells, which show the peers' signatures)."""
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        for m in SPAN.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            row = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
            if page.name in PEER_COLUMNS and row.startswith("|") and row.count("|") == 4:
                continue
            out.append((page.relative_to(DOCS).as_posix(), line, m.group(1), " ".join(m.group(2).split())))
    return out


def _split(args: str) -> list[str]:
    """The top-level comma-separated pieces of an argument list."""
    pieces, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(args):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append(args[start:i].strip())
            start = i + 1
    pieces.append(args[start:].strip())
    return [p for p in pieces if p]


def _parameters(obj) -> list[inspect.Parameter]:
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _literal(node):
    """``(True, value)`` for a literal or an arithmetic of literals (``8 * 2**20``), else
    ``(False, None)``."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        pass
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)
    if all(isinstance(n, allowed) for n in ast.walk(node)):
        return True, eval(compile(ast.Expression(node), "<docs>", "eval"), {"__builtins__": {}})  # noqa: S307
    return False, None


def _check(name: str, args: str, obj) -> list[str]:
    """The problems of one span (empty: it equals the code)."""
    pieces = _split(args)
    elided = "..." in pieces  # a signature that leaves parameters out says so
    if "*" in pieces:  # keyword-only parameters follow: a bare name there is `name=...`
        star = pieces.index("*")
        pieces = pieces[:star] + [p if "=" in p or p == "..." else f"{p}=..." for p in pieces[star + 1 :]]
    try:
        call = ast.parse(f"f({', '.join(p for p in pieces if p != '...')})", mode="eval").body
    except SyntaxError:
        return [f"cannot be read as Python arguments: ({args})"]
    while isinstance(call, ast.Call) and not (isinstance(call.func, ast.Name) and call.func.id == "f"):
        call = call.func  # `Name(...)(...)`: the first call is Name's
    while not isinstance(call, ast.Call):  # `Name(...).attr(...)` and the like
        call = call.value
    params = _parameters(obj)
    names = [p.name for p in params]
    variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in inspect.signature(obj).parameters.values())
    shown_pos = list(call.args)
    problems = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(shown_pos) > len(positional) and not variadic:
        problems.append(f"{len(shown_pos)} positional arguments, the code takes {len(positional)}")
    short = name.rpartition(".")[2]
    for kw in call.keywords:
        if kw.arg not in names and not variadic and (short, kw.arg) not in DEPRECATED_SHOWN:
            problems.append(f"keyword {kw.arg}= is not a parameter (the code has {names})")
    # a signature: it starts at the first parameter and shows names / the real defaults
    as_names = [a.id for a in shown_pos if isinstance(a, ast.Name)]
    first = (as_names[:1] or [kw.arg for kw in call.keywords[:1]])
    defaults_match = all(
        kw.arg in names and _literal(kw.value)[0] and params[names.index(kw.arg)].default is not inspect.Parameter.empty
        and _literal(kw.value)[1] == params[names.index(kw.arg)].default
        for kw in call.keywords if not (isinstance(kw.value, ast.Constant) and kw.value.value is Ellipsis)
    )
    is_signature = (
        names and first == names[:1] and as_names == names[: len(as_names)] and len(as_names) == len(shown_pos)
        and defaults_match and len(as_names) + len(call.keywords) >= 2
    )
    if is_signature and not problems:
        shown = as_names + [kw.arg for kw in call.keywords]
        if elided or any(isinstance(kw.value, ast.Constant) and kw.value.value is Ellipsis for kw in call.keywords):
            order = [n for n in names if n in shown]
            if order != shown:
                problems.append(f"shows {shown} in another order than the code's {names}")
        elif shown != names:
            missing = [n for n in names if n not in shown]
            problems.append(f"shows {shown}, the code's signature is {names} (missing {missing}; or write ...)")
    return problems


def test_every_documented_signature_equals_the_code():
    public = set(vispos.__all__)
    problems, unknown = [], set()
    for page, line, name, args in _spans():
        obj = _resolve(name)
        if obj is None:
            close = difflib.get_close_matches(name.rpartition(".")[2], public, n=1, cutoff=0.85)
            if close and name not in NOT_VISPOS:  # a misspelt vispos name, not a peer's
                unknown.add(f"{page}:{line} {name} (did you mean {close[0]}?)")
            continue
        for problem in _check(name, args, obj):
            problems.append(f"{page}:{line} `{name}({args})`: {problem}")
    assert sorted(unknown) == [], "names close to a vispos name but not one (or list them in NOT_VISPOS)"
    assert problems == []


def _fixture_callable(a, b=1, *, c=None, d=False):  # pragma: no cover - only its signature is read
    """A callable whose signature the checks below are tried on."""


@pytest.mark.parametrize(
    "args, ok",
    [
        ("a, b=1, c=None, d=False", True),
        ("a, b=1, ...", True),
        ("a, ..., d=False", True),
        ("a, b=1, c=None", False),  # a signature that leaves d out without saying so
        ("a, b", False),  # the same, by names
        ("a", True),  # one name: a call
        ("a, b=2, c=None", True),  # a call (b is not its default): binds
        ("a, d=False, b=1, ...", False),  # out of order
        ("a, e=3", False),  # an unknown keyword
        ("1, 2, 3", False),  # too many positional arguments
        ("x, c=None", True),  # a call
        ("a, b, *, c, d", True),  # keyword-only parameters shown after *
        ("a, b, c, d", False),  # c and d are keyword-only: not positions
    ],
)
def test_the_check_can_fail(args, ok):
    assert (_check("fixture", args, _fixture_callable) == []) is ok
