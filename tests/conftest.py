import os

import pytest
import torch

# Under pytest-xdist (README's command: -n 2) each worker takes its share of the cores, so two
# workers do not each start one torch thread per core.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# Without a GPU the Triton kernels are tested on the CPU through Triton's interpreter. Triton builds
# its own library functions (tl.sum, tl.cdiv, ...) compiled or interpreted once, when it is first
# imported (importing vispos imports it): the interpreter is chosen before that, for the whole run.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# CUDA results are compared with the CPU's at float32 tolerances: cuDNN's default TensorFloat-32
# convolutions (10-bit mantissa on Ampere and later) would move them by about 1e-3 relative.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def _runs_on_cuda(item) -> bool:
    """Parametrized over a CUDA device, naming ``cuda`` in its body (``torch.cuda.is_available()``,
    ``.cuda()``), or skipped without CUDA."""
    callspec = getattr(item, "callspec", None)
    for value in (callspec.params.values() if callspec else ()):
        if (isinstance(value, str) and value.startswith("cuda")) or getattr(value, "type", None) == "cuda":
            return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    if code is not None and "cuda" in code.co_names:
        return True
    return any("CUDA" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    """Every test that uses a CUDA device carries the ``cuda`` marker, so ``pytest -m cuda`` runs
    them all on a GPU machine (on a CPU-only one they skip or run their CPU part)."""
    for item in items:
        if item.get_closest_marker("cuda") is None and _runs_on_cuda(item):
            item.add_marker(pytest.mark.cuda)


@pytest.fixture
def registry():
    """vispos.invariance's global rule book, restored after the test (a test may register its own
    rules or tracing policy)."""
    from vispos.invariance import default_rules

    saved = default_rules().copy()
    yield default_rules()
    default_rules().restore(saved)
