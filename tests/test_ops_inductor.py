"""vispos.ops._inductor: under AOTAutograd (what ``torch.compile`` runs before inductor) the fused ops
decompose into their Triton kernels' launches (``triton_kernel_wrapper_functional`` nodes, which
inductor lowers to its own launches), on the Triton path only.

Without a GPU: CUDA tensors are fake (``FakeTensorMode`` makes them without a device), so graphs are
traced, not run. Shown here:

* the forward graph of a function calling the batch norm, the group norm and the sine embedding of a
  NestedTensor, on fake CUDA inputs, holds the five forward kernels and no ``vispos`` op;
* a training trace holds the five forward kernels in the forward graph and the four backward
  kernels in the backward graph, with the tensors each kernel writes found by Triton's mutation
  analysis (a fresh process: Triton imported outside interpreter mode, a GPU target named for the
  TTIR). Training is traced on CPU tensors with the decomposition switched on for them
  (:func:`vispos.ops._inductor.decompose_cpu`): autograd's engine refuses fake CUDA tensors
  without a device;
* on the CPU, and under ``torch.export``, each op stays one node;
* a decomposed graph runs (its launches through Triton's interpreter) and gives the ops' numbers,
  running statistics included; each op's Triton path as a function (``DECOMPOSITIONS``) gives the
  op's numbers;
* inductor's code generator emits every kernel with its helpers (valid Python).

With CUDA: ``torch.compile(backend="inductor")`` of a training step launches the kernels from
inductor's code (no ``torch.ops.vispos`` call left) and matches eager mode.
"""

import contextlib
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from functorch.compile import make_boxed_func  # noqa: E402
from torch._functorch.aot_autograd import aot_function  # noqa: E402
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import vispos  # noqa: E402
import vispos._checks  # noqa: E402
from vispos.ops import _inductor, _triton  # noqa: E402
from vispos.ops import _sizes as geometry  # noqa: E402
from vispos.ops.batch_norm import batch_norm  # noqa: E402
from vispos.ops.group_norm import group_norm  # noqa: E402

FORWARD = ["_bn_stats", "_bn_apply", "_gn_stats", "_gn_apply", "sine_embed_kernel"]
BACKWARD = {"_gn_grad_sums", "_gn_grad_apply", "_bn_grad_sums", "_bn_grad_apply"}
HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------------------ helpers
def _install_wrapped(monkeypatch=None):
    """``vispos.ops._triton.wrapped`` (a launch inside it is ``wrap_triton(kernel)[grid](...)``),
    installed here until ``_triton`` has it (the hook ``_inductor`` asks of ``_triton``)."""
    if hasattr(_triton, "wrapped"):
        return

    @contextlib.contextmanager
    def wrapped():
        before = getattr(_triton._STATE, "wrapped", False)
        _triton._STATE.wrapped = True
        try:
            yield
        finally:
            _triton._STATE.wrapped = before

    launch = _triton._Kernel.__getitem__

    def getitem(self, grid):
        if getattr(_triton._STATE, "wrapped", False):
            from torch.library import wrap_triton

            return wrap_triton(self.variant(False))[grid]
        return launch(self, grid)

    for owner, name, value in ((_triton, "wrapped", wrapped), (_triton._Kernel, "__getitem__", getitem)):
        if monkeypatch is None:
            setattr(owner, name, value)
        else:
            monkeypatch.setattr(owner, name, value, raising=False)


class _DropMutationWarning(logging.Filter):
    def filter(self, record):
        return not record.getMessage().startswith("Encountered an exception in identify_accessed_tensors")


@pytest.fixture(autouse=True)
def _wrapped(monkeypatch):
    _install_wrapped(monkeypatch)
    monkeypatch.setattr(vispos._checks, "memory_bytes", lambda device: 1 << 40)  # fake CUDA: no device to ask
    # this process imported Triton in interpreter mode (conftest): Triton's mutation analysis
    # cannot build TTIR, and torch warns, with a traceback, at every launch it traces
    quiet = logging.getLogger("torch._dynamo")
    drop = _DropMutationWarning()
    quiet.addFilter(drop)
    yield
    quiet.removeFilter(drop)


def _pe(num_pos_feats=128):
    return vispos.PositionEmbeddingSine(num_pos_feats, normalize=True, cache_size=0)


def _step(pe):
    """Batch norm (running statistics updated), group norm and the sine embedding of a NestedTensor
    padded from two images of their own sizes."""

    def step(a, b, weight, bias, running_mean, running_var, num_batches_tracked, dim_t):
        nested = vispos.nested_tensor_from_tensor_list([a, b])
        mask = nested.mask[:, None]
        y = batch_norm(nested.tensors, weight, bias, mask, 0, 1e-5, True, 0.1, running_mean, running_var,
                       num_batches_tracked)
        y = group_norm(y, weight, bias, mask, 2, 1e-5)
        pos = torch.func.functional_call(pe, {"dim_t": dim_t}, (nested.with_features(y),))
        return y, pos

    return step


def _inputs(device, grad=False, dim_t=None, seed=0):
    """:func:`_step`'s arguments: two images (4 channels), the norms' affine map and running
    statistics, the embedding's frequency divisors."""
    g = torch.Generator().manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(device).requires_grad_(grad)

    stats = (torch.rand(4, generator=g).to(device), torch.rand(4, generator=g).to(device) + 0.5,
             torch.tensor(3, device=device))
    return (t(4, 8, 6), t(4, 5, 8), t(4), t(4), *stats,
            (torch.randn(64) if dim_t is None else dim_t).to(device))


def _trace(device, train=False):
    """The graphs AOTAutograd hands its compilers for :func:`_step` on fake ``device`` inputs
    (forward, then backward when training)."""
    graphs = []

    def record(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm)

    with FakeTensorMode():
        pe = _pe()
        args = _inputs(device, grad=train)
        y, pos = aot_function(_step(pe), fw_compiler=record, bw_compiler=record)(*args)
        if train:
            (y.sum() + pos.sum()).backward()
    return graphs


def _launched(gm):
    """``[(kernel name, sorted tensors it writes)]`` of a graph's kernel wrapper nodes, in order."""
    found = []
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", str(node.target))
        if node.op == "call_function" and name.startswith("triton_kernel_wrapper"):
            kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            found.append((kernel.fn.__name__, sorted(node.kwargs.get("tensors_to_clone", ()))))
    return found


def _vispos_ops(gm):
    """The ``vispos`` ops a graph calls, directly or through ``auto_functionalized``."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        targets = [node.target, *node.args[:1]]
        names += [str(t) for t in targets if "vispos" in str(t)]
    return names


def _kernels():
    """Every vispos kernel: ``{its triton.jit function: its interpreted twin}``."""
    from vispos.ops import _batch_norm_kernels, _group_norm_kernels, sine

    kernels = [k for m in (_batch_norm_kernels, _group_norm_kernels) for k in vars(m).values()
               if isinstance(k, _triton._Kernel)] + [sine._kernel()]
    return {k.variant(False): k.variant(True) for k in kernels}


class _Twin:
    """Stands for a kernel in torch's side table (the kernel itself, or the one-config autotuner
    that carries its launch options): launches its interpreted twin (which runs no warps)."""

    def __init__(self, kernel, twin):
        self.fn, self.configs = kernel.fn, getattr(kernel, "configs", [])
        self.arg_names, self._twin = twin.arg_names, twin

    def __getitem__(self, grid):
        return self._twin[grid]


@contextlib.contextmanager
def _interpreting_side_table():
    """The kernel wrapper nodes launch each kernel's interpreted twin (they find kernels by index in
    torch's side table); the table restored after."""
    twins = _kernels()
    table = kernel_side_table.id_to_kernel
    saved = dict(table)
    for idx, kernel in saved.items():
        jit = kernel if kernel in twins else getattr(kernel, "fn", None)
        if jit in twins:
            table[idx] = _Twin(kernel, twins[jit])
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


# --------------------------------------------------------------------------- fake CUDA
def test_fake_cuda_forward_graph_launches_the_kernels_and_calls_no_op():
    (forward,) = _trace("cuda")
    assert [name for name, _ in _launched(forward)] == FORWARD
    assert _vispos_ops(forward) == []


def test_cpu_ops_stay_one_node():
    """The torch path (CPU): each op one node; inside ``interpreted()`` (CPU calls take the kernels)
    too, the decomposition being for CUDA tensors only."""
    (forward,) = _trace("cpu")
    assert _launched(forward) == []
    assert sorted(_vispos_ops(forward)) == ["vispos.valid_batch_norm.default", "vispos.valid_group_norm.default"]
    with _triton.interpreted():
        (forward,) = _trace("cpu")
    assert _launched(forward) == []
    assert sorted(_vispos_ops(forward)) == ["vispos.sine_counts.default", "vispos.valid_batch_norm.default",
                                            "vispos.valid_group_norm.default"]


def test_export_keeps_the_op():
    """torch.export (which switches ``decompose_custom_triton_ops`` off) keeps the op, also after
    ``run_decompositions``, on CUDA inputs."""

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4))
            self.register_buffer("running_mean", torch.zeros(4))
            self.register_buffer("running_var", torch.ones(4))

        def forward(self, x, mask):
            return batch_norm(x, self.weight, None, mask, 0, 1e-5, True, 0.1, self.running_mean, self.running_var,
                              None)

    with FakeTensorMode():
        with torch.device("cuda"):
            module = Norm()
            args = torch.randn(2, 4, 5, 6), torch.zeros(2, 1, 5, 6, dtype=torch.bool)
        program = torch.export.export(module, args)
        for graph in (program.graph_module, program.run_decompositions().graph_module):
            assert _launched(graph) == []
            assert _vispos_ops(graph) == ["vispos.valid_batch_norm.default"]
    with torch._functorch.config.patch(decompose_custom_triton_ops=False):
        (forward,) = _trace("cuda")
    assert _launched(forward) == [] and len(_vispos_ops(forward)) == 3


def test_decomposes_only_the_triton_path():
    with FakeTensorMode():
        x, empty = torch.randn(2, 3, 4, device="cuda"), torch.randn(0, 3, 4, device="cuda")
        assert _inductor.decomposes("valid_group_norm", (x, None, None, None, 1, 1e-5))
        assert not _inductor.decomposes("valid_group_norm", (empty, None, None, None, 1, 1e-5))
        assert not _inductor.decomposes("valid_group_norm", (x.cpu(), None, None, None, 1, 1e-5))
        backward = (x, None, x, None, None, x, x, 1, True, False, False)
        assert not _inductor.decomposes("valid_group_norm_backward", backward)  # the forward ran torch's code
        assert _inductor.decomposes("valid_group_norm_backward", (x, x) + backward[2:])
    with _triton.interpreted():
        assert not _inductor.decomposes("sine_boxes", (torch.zeros(1, 4, 3), None))
        with _inductor.decompose_cpu():
            assert _inductor.decomposes("sine_boxes", (torch.zeros(1, 4, 3), None))


# ---------------------------------------------------------------------------- numbers
@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 64 cells: the 8 x 8 maps run one block per item (Triton's interpreter takes a
    tenth of a second per program of 1024 cells)."""
    monkeypatch.setattr(geometry, "BLOCK_CELLS", 64)


def test_decomposed_graph_runs_and_gives_the_ops_numbers(small_tiles):
    """A forward graph traced with the decomposition (CPU tensors, the kernels interpreted) gives
    the numbers of the ops called in eager mode, the running statistics written back included."""
    pe = _pe(16)
    step = _step(pe)
    graphs = []

    def compiler(gm, _):
        graphs.append(gm)

        def run(args):
            with _interpreting_side_table():
                return gm(*args)

        run._boxed_call = True
        return run

    with _triton.interpreted():
        want_args, got_args = _inputs("cpu", dim_t=pe.dim_t), _inputs("cpu", dim_t=pe.dim_t)
        want = step(*want_args)
        with _inductor.decompose_cpu():
            got = aot_function(step, fw_compiler=compiler)(*got_args)
    assert [name for name, _ in _launched(graphs[0])] == FORWARD
    assert _vispos_ops(graphs[0]) == []
    for a, b in zip((*want, *want_args[4:7]), (*got, *got_args[4:7])):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert int(got_args[6]) == 4


def test_each_decomposition_gives_its_ops_numbers(small_tiles):
    """``DECOMPOSITIONS``: each op's Triton path, called as a function, equals the op."""
    ops, paths = torch.ops.vispos, {name: fn for name, (fn, _, _) in _inductor.DECOMPOSITIONS.items()}
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(2, 4, 5, 6, generator=g), torch.randn(2, 4, 5, 6, generator=g)
    mask = torch.zeros(2, 1, 5, 6, dtype=torch.bool)
    mask[1, :, 3:] = True
    w, b = torch.randn(4, generator=g), torch.randn(4, generator=g)

    def same(got, want):
        for a, c in zip(got, want):
            torch.testing.assert_close(a, c, rtol=0, atol=0)

    with _triton.interpreted():
        stats = [(torch.zeros(4), torch.ones(4), torch.tensor(0)) for _ in range(2)]
        want = ops.valid_batch_norm(x, w, b, mask, 0, 1e-5, False, None, *stats[0])
        same(paths["valid_batch_norm"](x, w, b, mask, 0, 1e-5, False, None, *stats[1]), want)
        same(stats[1], stats[0])
        grads = (dy, x, want[3], mask, w, want[1], want[2], 0, False, True, True, True)
        same(paths["valid_batch_norm_backward"](*grads), ops.valid_batch_norm_backward(*grads))
        want = ops.valid_group_norm(x, w, b, mask, 2, 1e-5)
        same(paths["valid_group_norm"](x, w, b, mask, 2, 1e-5), want)
        grads = (dy, x, want[3], mask, w, want[1], want[2], 2, True, True, False)
        same(paths["valid_group_norm_backward"](*grads), ops.valid_group_norm_backward(*grads))
        divisors = torch.rand(4) + 1
        boxes = torch.tensor([[0, 0, 5, 6], [1, 2, 4, 5]], dtype=torch.int32)
        counts = [mask[:, 0].int().cumsum(i + 1, dtype=torch.int32) for i in range(2)]
        for name, extra in (("sine_boxes", boxes), ("sine_counts", counts)):
            out_op, out_path = torch.empty(2, 16, 5, 6), torch.empty(2, 16, 5, 6)
            rule = (divisors, None, True, 6.28, -0.5, 1e-6, None)
            getattr(ops, name)(out_op, extra, *rule)
            paths[name](out_path, extra, *rule)
            same([out_path], [out_op])


# ----------------------------------------------------------------- inductor, no device
def test_inductor_emits_every_kernel_with_its_helpers():
    """The source inductor writes for each kernel (a user-defined Triton kernel with the
    ``@triton.jit`` helpers it calls) is valid Python that defines every helper it calls."""
    from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code

    for jit in _kernels():
        source = user_defined_triton_kernel_transitive_closure_source_code(jit)
        code = compile(source, jit.fn.__name__, "exec")
        defined = {c.co_name for c in code.co_consts if hasattr(c, "co_name")}
        assert jit.fn.__name__ in defined
        called = {n for n in jit.fn.__code__.co_names if n in vars(sys.modules[jit.fn.__module__])
                  and hasattr(vars(sys.modules[jit.fn.__module__])[n], "src")}
        assert called <= defined, called - defined


_TRAINING = """
import json, sys
import vispos.ops._inductor, vispos.ops.batch_norm, vispos.ops.group_norm, vispos.ops.sine
no_triton = "triton" not in sys.modules
sys.path.insert(0, {here!r})
import test_ops_inductor as t
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from vispos.ops import _inductor, _triton
import vispos._checks

class Target:  # the GPU Triton's mutation analysis generates TTIR for (nothing runs)
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

driver.set_active(Target())
t._install_wrapped()
vispos._checks.memory_bytes = lambda device: 1 << 40
with _triton.interpreted(), _inductor.decompose_cpu():
    train = t._trace("cpu", train=True)
infer = t._trace("cuda")
print(json.dumps({{"no_triton": no_triton, "train": [t._launched(g) for g in train],
                  "infer": [t._launched(g) for g in infer], "ops": [t._vispos_ops(g) for g in train + infer]}}))
"""


@pytest.mark.slow  # a fresh process: about 6 s on 2 cores
def test_training_graphs_launch_the_kernels_with_their_writes(tmp_path):
    """In a process where Triton is imported outside interpreter mode, with a GPU target for the
    TTIR, Triton's mutation analysis finds what each kernel writes; a training trace then holds
    the forward kernels in the forward graph and the backward kernels in the backward graph, and
    no op. Also: importing the ops and this decomposition imports no Triton."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _TRAINING.format(here=HERE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "assuming every input is mutated" not in proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["no_triton"]
    writes = {"_bn_stats": ["nbt_ptr", "part_ptr"],
              "_bn_apply": ["invstd_ptr", "mean_ptr", "rm_ptr", "rv_ptr", "y_ptr"], "_gn_stats": ["part_ptr"],
              "_gn_apply": ["mean_ptr", "rstd_ptr", "y_ptr"],
              "sine_embed_kernel": ["out_ptr"], "_bn_grad_sums": ["part_ptr"],
              "_bn_grad_apply": ["gb_ptr", "gw_ptr", "gx_ptr"], "_gn_grad_sums": ["partc_ptr", "partg_ptr"],
              "_gn_grad_apply": ["gb_ptr", "gw_ptr", "gx_ptr"]}
    (forward, backward), (inference,) = got["train"], got["infer"]
    assert [name for name, _ in forward] == FORWARD == [name for name, _ in inference]
    assert {name for name, _ in backward} == BACKWARD and len(backward) == 4
    for name, written in forward + backward + inference:
        assert written == writes[name], name
    assert got["ops"] == [[], [], []]


# ------------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inductor_launches_the_kernels_of_a_training_step():
    """torch.compile (inductor) of a training step: the generated code launches every vispos
    kernel itself, calls no vispos op, and gives eager mode's outputs, gradients and running
    statistics."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    pe = _pe().cuda()
    step = _step(pe)
    eager_args, compiled_args = (_inputs("cuda", grad=True, dim_t=pe.dim_t, seed=2) for _ in range(2))
    compiled = torch.compile(step, backend="inductor", fullgraph=True)

    def train(fn, args):
        y, pos = fn(*args)
        (y.square().sum() + pos.sum()).backward()
        return y, pos

    want = train(step, eager_args)
    got, codes = run_and_get_code(lambda: train(compiled, compiled_args))
    code = "\n".join(codes)
    assert "torch.ops.vispos" not in code
    for name in FORWARD + sorted(BACKWARD):
        assert name in code, name
    for a, b in zip((*want, *eager_args[4:7]), (*got, *compiled_args[4:7])):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for a, b in zip(eager_args[:4], compiled_args[:4]):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)
