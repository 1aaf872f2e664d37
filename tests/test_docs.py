"""The documentation site builds offline with ``mkdocs build --strict`` and its API page renders
``PositionEmbeddingSine``'s signature in headless Chromium (Debian's ``chromium`` package).

Skipped only when mkdocs (the ``docs`` extra) or chromium is not installed; CI installs both.
"""

import html
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run",
]


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed (apt-get install chromium)")


def _text(dom: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", dom)))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material"):
        _needs(module)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", os.path.join(ROOT, "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # mkdocs' own warnings ("WARNING  -  ..."); other libraries' log lines (absl's "WARNING: All
    # log messages ...", printed when griffe imports vispos.keras and TensorFlow) are not mkdocs'
    assert not re.search(r"^WARNING\s+-", proc.stderr, flags=re.M), proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_site_builds_offline(site):
    pages = [os.path.join(d, f) for d, _, files in os.walk(site) for f in files if f.endswith(".html")]
    names = {os.path.relpath(p, site) for p in pages}
    for page in ("index.html", "getting-started.html", "concepts.html", "cli.html", "performance.html",
                 "deployment.html", "migration.html", "backbones.html", "configs.html", "figures.html",
                 "encoders/sine.html", "api/index.html", "api/backbones.html", "api/utilities.html"):
        assert page in names
    assert not os.path.exists(os.path.join(site, "hooks.py"))
    for page in pages:
        text = open(page, encoding="utf-8").read()
        # nothing fetched from the network when the page renders: no CDN fonts, scripts or styles
        assert not re.search(r"<(link|script|img)[^>]+(href|src)=\"(https?:)?//", text), page
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
    for image in ("similarity_2d.png", "volume_similarity.png"):
        assert os.path.getsize(os.path.join(site, "images", image)) < 200_000


@pytest.mark.slow
def test_api_page_renders_signature_in_chromium(site, tmp_path):
    chromium = _chromium()
    page = os.path.join(site, "api", "index.html")
    proc = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"file://{page}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = _text(proc.stdout)
    assert "PositionEmbeddingSine(num_pos_feats: int = 64, temperature: float = 10000, normalize: bool = False," in text
    assert "DETR's sinusoidal position embedding for 1, 2 or 3 spatial axes" in text


def test_hook_warns_on_undocumented_public_object(monkeypatch, caplog):
    """The strict build fails when a public object has no docstring: the hook warns for it."""
    spec = importlib.util.spec_from_file_location("vispos_docs_hooks", os.path.join(ROOT, "docs", "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)

    def undocumented():
        return None

    fake = types.ModuleType("vispos_fake_public")
    fake.__doc__ = "A module."
    fake.__all__ = ["undocumented", "documented"]
    fake.undocumented = undocumented
    def documented():
        """Has a docstring."""

    fake.documented = documented
    monkeypatch.setitem(sys.modules, "vispos_fake_public", fake)
    monkeypatch.setattr(hooks, "MODULES", ("vispos", "vispos_fake_public"))
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.vispos"):
        hooks.on_pre_build(config=None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["public object without a docstring: vispos_fake_public.undocumented"]


def test_hook_strips_sphinx_roles():
    spec = importlib.util.spec_from_file_location("vispos_docs_hooks2", os.path.join(ROOT, "docs", "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    html_in = "see :func:<code>cumulative_positions</code> and :class:<code>~vispos.backbones.Joiner</code>."
    assert hooks.on_page_content(html_in) == "see <code>cumulative_positions</code> and <code>Joiner</code>."


def test_readme_setup_says_a_second_clone_takes_over_the_command():
    """The setup puts one editable venv at ``~/.cache/vispos/venv``: the paragraph before its
    commands says that installing a second clone there moves ``vispos`` to that clone."""
    with open(os.path.join(ROOT, "README.md")) as f:
        setup = f.read().split("```bash", 1)[0]
    prose = " ".join(setup.split())
    assert "`~/.cache/vispos/venv`" in prose and "second clone" in prose, "README setup paragraph"


def test_one_test_command_in_readme_getting_started_and_ci():
    """README's test command (its second fresh-machine command) is the source: ``.ci/run`` runs it
    verbatim and docs/getting-started.md shows it verbatim (the page once lacked ``-n 2``)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
    assert len(commands) == 2, "README's 'Two commands' section should hold two bash blocks"
    command = commands[1].strip()
    assert "pytest" in command and "\n" not in command, command
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci_lines = [line.strip() for line in f]
    assert command in ci_lines, ".ci/run does not run README's test command verbatim"
    with open(os.path.join(ROOT, "docs", "getting-started.md")) as f:
        page_lines = [line.strip() for line in f]
    assert command in page_lines, "docs/getting-started.md does not show README's test command verbatim"
