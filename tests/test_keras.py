"""``vispos.keras``: import isolation here, and the layer tests once per installed Keras backend.

Keras reads ``KERAS_BACKEND`` once, when it is first imported, and TensorFlow is slow to import
and competes with torch for threads; so nothing here imports keras. Each backend runs
``tests/keras_cases.py`` in its own ``python -m pytest`` subprocess, and must pass with nothing
skipped. Backends that are not installed are skipped here; so is everything when keras is not.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "keras_cases.py"
HAS_KERAS = importlib.util.find_spec("keras") is not None
# the module each backend needs besides keras
BACKENDS = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(**env), capture_output=True, text=True,
        timeout=300,
    )


def test_import_vispos_loads_no_keras_nor_tensorflow():
    code = (
        "import sys, vispos\n"
        "loaded = sorted(m for m in ('keras', 'tensorflow', 'jax', 'vispos.keras') if m in sys.modules)\n"
        "print(loaded)\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_missing_keras_says_how_to_install():
    # ``sys.modules[name] = None`` makes ``import name`` raise ImportError, as when absent
    code = (
        "import sys\n"
        "sys.modules['keras'] = None\n"
        "try:\n"
        "    import vispos.keras\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert re.search(r"vispos\.keras needs Keras 3 and a backend: pip install 'vispos\[keras\]'", done.stdout)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_KERAS, reason="keras is not installed (pip install 'vispos[keras]')")
@pytest.mark.parametrize("backend", [b if b == "tensorflow" else pytest.param(b, marks=pytest.mark.exhaustive)
                                     for b in sorted(BACKENDS)])  # the extra's backend by default
def test_backend(backend, tmp_path):
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        pytest.skip(f"the {backend} backend is not installed")
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
            f"--basetemp={tmp_path / 'pytest'}", str(CASES),
        ],
        cwd=ROOT, env=_env(KERAS_BACKEND=backend), capture_output=True, text=True, timeout=900,
    )
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"KERAS_BACKEND={backend}:\n{tail}"
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 100, f"KERAS_BACKEND={backend}: {summary}"
    assert not re.search(r"skipped|deselected|error", summary), f"KERAS_BACKEND={backend}: {summary}"
