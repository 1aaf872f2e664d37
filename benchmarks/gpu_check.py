"""One GPU command: CUDA against CPU, host syncs, CUDA graphs, torch.compile and timings, one table.

Run on a machine with one CUDA device (about 8 minutes, imports and compilation included):

    python benchmarks/gpu_check.py --out benchmarks/results_gpu.md

It writes one markdown table (a header names the card, torch and the date) and rewrites it after
every row, so a run cut short still leaves what it measured. Sections, in this order:

1. **CUDA = CPU**: every encoder family (``_gpu_cases.FAMILIES``) built on the CPU under one
   seed, moved to the GPU, and compared whole (max abs difference, tolerance stated in the row);
   the invariant backbones (timm ``resnet18`` and the volumetric ``r3d_18``, ``pretrained=False``,
   batch norms with trained-like statistics, float32 with TF32 off) on a padded batch, and each
   item run alone against its cells in the padded batch, on the GPU.
2. **No host sync**: every family's forward (warm, caches off) and the backbones' forward (eval
   and train) under ``torch.cuda.set_sync_debug_mode("error")``.
3. **CUDA graph**: ``PositionEmbeddingSine(..., out=buffer)`` and the invariant backbones captured
   with ``torch.cuda.CUDAGraph`` on static inputs, the inputs' contents replaced, replayed, and
   compared with eager calls on the new contents.
4. **Timings**: ``bench_position_embedding.py``'s workloads (DETR C5, Deformable's levels, the 3D
   volumes; its floor, its interleaved steady-state loop and its rows: vispos and transformers'
   DETR), then the invariant / stock time ratio of timm ResNet-50 at B = 8 on padded images of
   480-640 px (eval forward, train forward + backward; interleaved, CUDA events, TF32 as torch's
   defaults leave it).
5. **torch.compile**: the sine embedding (``fullgraph=True``) and the invariant backbones
   (default mode; graph breaks counted), compared with eager, with the compile time.
6. **Host overhead** (``host_overhead.py``): vispos' Python per call of the fused ops on the CUDA
   code path with launches stubbed (measured on the CPU, on any machine), the invariant / stock
   ResNet-50 training step's host-time proxy, and the most compiled variants of a kernel.
7. **Invariance cost** (``_gpu_invariance.py``): the invariant / stock time ratio of one step for
   ResNet-50 (trainable and frozen batch norm), ConvNeXt-T, ViT-S/16 padded and packed and r3d_18,
   at B = 8 and 32, eval and train, float32 and bfloat16 autocast; then the training step of
   ResNet-50 and ViT-S compiled (B = 8) and captured in a CUDA graph (B = 8 and 32).

Every section has a time budget (and the whole run ``--budget`` seconds, with a watchdog that
ends the process after it); an error or a timeout goes into its row and the run goes on. Without
CUDA (``--device cpu``) the CUDA rows read "skipped (no CUDA)" (the ResNet-50 timings too: a GPU
timing), the other timings run on the CPU (``--quick``: smaller workloads), and the command exits 0
when every row it ran passed; ``tests/test_gpu_check.py`` runs it that way.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

START = time.monotonic()

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vispos  # noqa: E402
import bench_position_embedding as bench_pe  # noqa: E402
from _gpu_invariance import compiled_rows as invariance_compiled_rows, interleaved_ratio, invariance_rows  # noqa: E402
from _gpu_invariance import graphed_rows as invariance_graphed_rows  # noqa: E402
from _gpu_cases import BACKBONES, FAMILIES, c5_level, flat, item_alone, on, padded_items, valid_cells  # noqa: E402
from bench_detectors import gpu_rows as detector_rows  # noqa: E402
from vispos import nested_tensor_from_tensor_list  # noqa: E402

CPU = torch.device("cpu")
EMBED_ATOL = 1e-4
BACKBONE_TOL = 1e-4  # rtol and atol, float32, TF32 off
NO_CUDA = "skipped (no CUDA)"
#: the timed rows of bench_position_embedding's workloads kept here
TIMED_ROWS = (bench_pe.FLOOR, "vispos (NestedTensor, rectangular)", "vispos (bool mask, rectangular)",
              "vispos (arbitrary mask)", "vispos cached (NestedTensor), copy out")
RESNET50_SIZES = [(512, 640), (640, 480), (576, 608), (608, 544), (640, 640), (480, 640), (544, 576), (600, 512)]


class SectionTimeout(BaseException):
    """A section ran past its budget (not an ``Exception``: a case's handler lets it through)."""


class Table:
    """The report: rows of ``(section, case, result, value, criterion)``, rewritten to ``path``
    after every row."""

    def __init__(self, path: str | None, header: list[str], skip: str | None) -> None:
        self.path, self.header, self.skip = path, header, skip
        self.rows: list[tuple[str, ...]] = []
        self.footer: list[str] = []
        self.lock = threading.Lock()

    def add(self, *row: str) -> None:
        with self.lock:
            self.rows.append(tuple(str(v).replace("|", "/").replace("\n", " ") for v in row))
            print("| " + " | ".join(self.rows[-1]) + " |", flush=True)
            self.write()

    def check(self, section: str, case: str, criterion: str, fn: Callable[[], tuple], cuda: bool = True) -> None:
        """Runs ``fn() -> (ok, value)`` (``ok`` None: a measurement) into one row; a ``cuda`` row
        without a CUDA device reads ``skip``."""
        if self.skip and cuda:
            return self.add(section, case, self.skip, "-", criterion)
        try:
            ok, value = fn()
            result = "measured" if ok is None else ("pass" if ok else "FAIL")
        except Exception as exc:  # noqa: BLE001 - the row says what failed, the run goes on
            result, value = "error", f"{type(exc).__name__}: {str(exc)[:160]}"
        self.add(section, case, result, value, criterion)

    def render(self) -> str:
        lines = list(self.header) + ["", "| section | case | result | value | criterion |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines + [""] + self.footer) + "\n"

    def write(self) -> None:
        if self.path:
            with open(self.path, "w") as fh:
                fh.write(self.render())


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raises :class:`SectionTimeout` in the main thread after ``seconds``."""

    def expire(signum, frame):
        raise SectionTimeout(f"over its budget of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def tf32(enabled: bool):
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def compare(ref, got, atol: float, rtol: float = 0.0) -> tuple[bool, str]:
    """Whole outputs: same shapes and dtypes, ``|got - ref| <= atol + rtol |ref|`` everywhere."""
    ref, got = flat(ref), flat(got)
    if len(ref) != len(got):
        return False, f"{len(got)} tensors, expected {len(ref)}"
    worst, ok = 0.0, True
    for a, b in zip(ref, got):
        a, b = a.detach().cpu(), b.detach().cpu()
        if a.shape != b.shape or a.dtype != b.dtype:
            return False, f"{tuple(b.shape)} {b.dtype}, expected {tuple(a.shape)} {a.dtype}"
        if a.dtype == torch.bool:
            ok &= bool(torch.equal(a, b))
            continue
        diff = (a.double() - b.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok &= bool((diff <= atol + rtol * a.double().abs()).all())
    return ok, f"max abs diff {worst:.2e}"


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------ sections
def families_equal(table: Table, dev, small: bool) -> None:
    with torch.no_grad():
        for name, setup in FAMILIES.items():
            table.check("CUDA = CPU", name, f"max abs diff <= {EMBED_ATOL:g}",
                        lambda setup=setup: compare(setup(CPU)(), setup(dev)(), EMBED_ATOL))


_BUILT: dict[str, torch.nn.Module] = {}


def backbone(name: str) -> torch.nn.Module:
    """The CPU invariant backbone ``name`` (built once; callers copy it with ``on``)."""
    if name not in _BUILT:
        torch.manual_seed(0)
        _BUILT[name] = BACKBONES[name][0]().eval()
    return _BUILT[name]


def backbones_equal(table: Table, dev, small: bool) -> None:
    crit = f"rtol = atol = {BACKBONE_TOL:g}, float32, TF32 off"
    for name, (_, make_items) in BACKBONES.items():
        def cuda_vs_cpu(name=name, make_items=make_items):
            batch = nested_tensor_from_tensor_list(make_items(small))
            with torch.no_grad(), tf32(False):
                ref = backbone(name)(batch)
                got = on(backbone(name), dev)(batch.to(dev))
            return compare(ref, got, BACKBONE_TOL, BACKBONE_TOL)

        def alone_vs_batch(name=name, make_items=make_items):
            items = make_items(small)
            model = on(backbone(name), dev)
            with torch.no_grad(), tf32(False):
                levels = model(nested_tensor_from_tensor_list(items).to(dev))
                results = [compare(item_alone(model, x, dev), padded_items(levels, i), BACKBONE_TOL, BACKBONE_TOL)
                           for i, x in enumerate(items)]
            if not all(v.startswith("max abs diff") for _, v in results):
                return False, "; ".join(v for _, v in results)
            worst = max(float(v.split()[-1]) for _, v in results)
            return all(ok for ok, _ in results), f"max abs diff {worst:.2e} over {len(items)} items"

        table.check("CUDA = CPU", f"{name}, padded batch, eval", crit, cuda_vs_cpu)
        table.check("padding invariance", f"{name}, each item alone = its cells in the batch (device)", crit,
                    alone_vs_batch)


def _no_sync(fn: Callable[[], object], dev) -> tuple[bool, str]:
    fn()
    fn()  # warm: lazy initialisation may synchronise once
    _sync(dev)
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as exc:
        if "synchroniz" not in str(exc):
            raise
        return False, f"synchronised: {str(exc)[:120]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _sync(dev)
    return True, "no synchronising call"


def no_host_sync(table: Table, dev, small: bool) -> None:
    crit = 'set_sync_debug_mode("error"), warm, caches off'
    with torch.no_grad(), vispos.caching(False):
        for name, setup in FAMILIES.items():
            table.check("no host sync", name, crit, lambda setup=setup: _no_sync(setup(dev), dev))
    for name, (_, make_items) in BACKBONES.items():
        for mode in ("eval", "train"):
            def run(name=name, make_items=make_items, mode=mode):
                model = on(backbone(name), dev).train(mode == "train")
                batch = nested_tensor_from_tensor_list(make_items(small)).to(dev)
                with torch.set_grad_enabled(mode == "train"):
                    return _no_sync(lambda: model(batch), dev)

            table.check("no host sync", f"{name}, {mode} forward", crit, run)


def capture(fn: Callable[[], object]):
    """``fn`` warmed on a side stream, then captured: ``(graph, its static output)``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def cuda_graphs(table: Table, dev, small: bool) -> None:
    from _fresh import arbitrary

    crit = f"replay = eager, max abs diff <= {EMBED_ATOL:g}"

    def sine(kind: str):
        pe = vispos.PositionEmbeddingSine(128, normalize=True).to(dev)
        nt = c5_level(dev)
        static = nt if kind == "nested" else arbitrary(nt.mask, seed=1)
        out = torch.empty_like(pe(static))
        graph, _ = capture(lambda: pe(static, out=out))
        if kind != "nested":  # new holes, the same buffer: the replay must read them
            static.copy_(arbitrary(nt.mask, seed=2))
        graph.replay()
        _sync(dev)
        return compare(pe(static), out, EMBED_ATOL)

    with torch.no_grad(), vispos.caching(False):
        table.check("CUDA graph", "PositionEmbeddingSine(out=), DETR C5 NestedTensor", crit, lambda: sine("nested"))
        table.check("CUDA graph", "PositionEmbeddingSine(out=), arbitrary mask, new holes before replay", crit,
                    lambda: sine("arbitrary"))
    for name, (_, make_items) in BACKBONES.items():
        def run(name=name, make_items=make_items):
            model = on(backbone(name), dev)
            batch = nested_tensor_from_tensor_list(make_items(small)).to(dev)
            with torch.no_grad(), tf32(False):
                graph, levels = capture(lambda: model(batch))
                new = nested_tensor_from_tensor_list([x.flip(-1) for x in make_items(small)]).to(dev)
                batch.tensors.copy_(new.tensors)  # same sizes, new pixels
                graph.replay()
                _sync(dev)
                return compare(model(new), levels, BACKBONE_TOL, BACKBONE_TOL)

        table.check("CUDA graph", f"{name}, eval, new pixels before replay",
                    f"replay = eager, rtol = atol = {BACKBONE_TOL:g}", run)


def _compiled(module, args, eager_out, dev, atol: float, rtol: float, keep=lambda out: out,
              **compile_kw) -> tuple[bool, str]:
    """Compiles ``module``, times its first call and compares ``keep`` of its output with
    ``keep(eager_out)``."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, **compile_kw)
    t0 = time.perf_counter()
    out = compiled(*args)
    _sync(dev)
    seconds = time.perf_counter() - t0
    ok, value = compare(keep(eager_out), keep(out), atol, rtol)
    breaks = sum(counters["graph_break"].values())
    return ok, f"{value}; compile {seconds:.1f} s; {breaks} graph breaks"


def compiled_rows(table: Table, dev, small: bool) -> None:
    from _fresh import arbitrary

    nt = c5_level(dev)
    for label, x in (("NestedTensor", nt), ("arbitrary mask", arbitrary(nt.mask))):
        def run(x=x):
            pe = vispos.PositionEmbeddingSine(128, normalize=True, offset=-0.5).to(dev)
            mask = x.mask if isinstance(x, vispos.NestedTensor) else x
            with torch.no_grad(), vispos.caching(False):
                return _compiled(pe, (x,), pe(x), dev, EMBED_ATOL, 0.0, keep=lambda out: valid_cells(out, mask),
                                 fullgraph=True)

        table.check("torch.compile", f"PositionEmbeddingSine, Deformable C5 {label}, fullgraph (valid cells)",
                    f"compiled = eager, max abs diff <= {EMBED_ATOL:g}", run)
    for name, (_, make_items) in BACKBONES.items():
        def run(name=name, make_items=make_items):
            model = on(backbone(name), dev)
            batch = nested_tensor_from_tensor_list(make_items(small)).to(dev)
            with torch.no_grad(), tf32(False):
                return _compiled(model, (batch,), model(batch), dev, BACKBONE_TOL, BACKBONE_TOL)

        table.check("torch.compile", f"{name}, eval, default mode",
                    f"compiled = eager, rtol = atol = {BACKBONE_TOL:g}, TF32 off", run)


def embedding_timings(table: Table, dev, small: bool, repeats: int) -> None:
    """``bench_position_embedding``'s workloads, loop and floor, on the rows of ``TIMED_ROWS``
    and transformers' DETR."""
    if dev.type == "cpu" and not small:  # full-size workloads on the CPU run past the section's budget
        small, repeats, why = True, 1, ", CPU: half size, one sample"
    else:
        why = ", --quick: half size" if small else ""
    crit = f"median of {repeats} interleaved samples ({dev.type}{why})"
    try:
        workloads = bench_pe.select(bench_pe.build_workloads(dev, small, grid_peers=False), "C5,Deformable,3D volumes")
        for wl in workloads:
            keep = [n for n in wl.impls if n in TIMED_ROWS or n.startswith("transformers")]
            wl.impls = {n: wl.impls[n] for n in keep}
            wl.device_rows = [n for n in wl.device_rows if n in keep]
            wl.never_hit = [(n, m) for n, m in wl.never_hit if n in keep]
        results = bench_pe.run(dev, repeats, small, workloads=workloads)
    except Exception as exc:  # noqa: BLE001
        table.add("timing", "position embeddings", "error", f"{type(exc).__name__}: {str(exc)[:160]}", crit)
        return
    for title, rows in results:
        ms = {name: med for name, med, *_ in rows}
        peer = next((v for n, v in ms.items() if n.startswith("transformers")), None)
        for name, med, ratio, ops, *_ in rows:
            vs = f", {med / peer:.2f}x transformers" if peer and name.startswith("vispos") else ""
            ops = ops[0] if isinstance(ops, tuple) else ops  # as dispatched on this device
            table.add("timing", f"{title.split(' (')[0]}: {name}", "measured",
                      f"{med:.3f} ms, {ratio:.2f}x floor{vs}, {ops} ops / call", crit)


def resnet50_ratio(table: Table, dev, small: bool, repeats: int) -> None:
    from bench_padding_invariant import MODES, _trained_like, step_fn
    from vispos.backbones import TimmBackbone

    sides = [s for size in RESNET50_SIZES for s in size]
    crit = (f"B = {len(RESNET50_SIZES)}, {min(sides)}-{max(sides)} px padded, median of {repeats} interleaved, "
            "TF32 default")
    if dev.type == "cpu":  # a GPU timing: on the CPU it measures convolutions and runs past its budget
        for mode in MODES:
            table.add("timing", f"ResNet-50 invariant / stock, {mode}", "skipped (--quick on CPU)" if small else NO_CUDA,
                      "-", crit)
        return
    state: dict = {}

    def setup():
        torch.manual_seed(0)
        stock = TimmBackbone("resnet50", out_indices=(2, 3, 4))
        _trained_like(stock)
        inv = TimmBackbone("resnet50", out_indices=(2, 3, 4), padding_invariant=True)
        inv.load_state_dict(stock.state_dict())
        g = torch.Generator().manual_seed(4)
        batch = nested_tensor_from_tensor_list([torch.randn(3, h, w, generator=g) for h, w in RESNET50_SIZES])
        state.update(models={"stock": stock.to(dev), "invariant": inv.to(dev)}, batch=batch.to(dev))

    for mode in MODES:
        def run(mode=mode):
            if not state:
                setup()
            fns = {arm: step_fn(m, state["batch"], mode) for arm, m in state["models"].items()}
            return interleaved_ratio(fns, dev, repeats)

        table.check("timing", f"ResNet-50 invariant / stock, {mode}", crit, run, cuda=False)


def host_overhead_rows(table: Table, small: bool) -> None:
    """``host_overhead.py``'s rows: vispos' Python per call on the CUDA code path (launches stubbed,
    measured on the CPU whatever the device) and the kernels' compiled variants, against the
    targets."""
    import host_overhead

    rows = host_overhead.measure(small, calls=None if small else 100, rounds=None if small else 3)
    add = rows["torch_add_us"]
    for key in host_overhead.KEYS:
        value, target = rows[key], host_overhead.TARGETS[key]
        if key.endswith("_us"):
            shown = f"{value:.1f} us ({rows['normalized_to_add_1.2us'][key]:.1f} us at torch.add = 1.2 us)"
        elif key == "resnet50_train_step_host_ratio":
            shown = f"{value:.2f}x (ResNet-50's graph at 1/16 width, B = {2 if small else 8}, CPU proxy)"
        else:
            shown = f"{value} ({', '.join(f'{k} {v}' for k, v in rows['kernel_variants'].items())})"
        crit = f"target <= {target:g}; torch.add on one element {add:.2f} us here"
        table.add("host overhead", key, "measured", shown, crit)


# ---------------------------------------------------------------------------------- main
def header(dev, args) -> list[str]:
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        extra = f", CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    else:
        name, extra = f"CPU only ({os.cpu_count()} cores, {torch.get_num_threads()} threads)", ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [f"# vispos GPU check: {name}", "",
            f"torch {torch.__version__}{extra}; vispos {vispos.__version__}; {now}; "
            f"`python benchmarks/gpu_check.py{' --quick' if args.quick else ''}`"]


def main(argv=None, started: float | None = None) -> int:
    """The command; ``started`` (``time.monotonic()``) is when the budget began: the process's start
    when run as a script (imports included), else this call."""
    start = time.monotonic() if started is None else started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the markdown table here (rewritten after every row)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small workloads, fewer repeats, no ResNet-50 on CPU")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run, imports included")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per row (default 11, quick 3)")
    args = parser.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        dev = CPU
    repeats = args.repeats or (3 if args.quick else 11)
    table = Table(args.out, header(dev, args), None if dev.type == "cuda" else NO_CUDA)
    deadline = start + args.budget

    def abort() -> None:  # a call stuck outside Python: write what there is and leave
        table.footer.append(f"Aborted by the watchdog after {time.monotonic() - start:.0f} s.")
        table.write()
        os._exit(3)

    watchdog = threading.Timer(max(args.budget - (time.monotonic() - start), 1.0) + 20.0, abort)
    watchdog.daemon = True
    watchdog.start()
    sections = [  # (name, budget s, fn)
        ("CUDA = CPU", 30, lambda: families_equal(table, dev, args.quick)),
        ("backbones", 30, lambda: backbones_equal(table, dev, args.quick)),
        ("no host sync", 25, lambda: no_host_sync(table, dev, args.quick)),
        ("CUDA graph", 25, lambda: cuda_graphs(table, dev, args.quick)),
        ("embedding timings", 45, lambda: embedding_timings(table, dev, args.quick, repeats)),
        ("ResNet-50 timings", 40, lambda: resnet50_ratio(table, dev, args.quick, repeats)),
        ("host overhead", 90, lambda: host_overhead_rows(table, args.quick)),
        ("torch.compile", 150, lambda: compiled_rows(table, dev, args.quick)),
        ("invariance cost", 200, lambda: invariance_rows(table, dev, args.quick, min(repeats, 5))),
        ("invariance cost, compiled", 150, lambda: invariance_compiled_rows(table, dev, min(repeats, 5))),
        ("invariance cost, CUDA graph", 120, lambda: invariance_graphed_rows(table, dev, min(repeats, 5))),
        ("detectors", 150, lambda: detector_rows(table, dev, args.quick, min(repeats, 5))),
    ]
    for name, budget, fn in sections:
        left = deadline - time.monotonic()
        if left < 5:
            table.add(name, "(whole section)", "skipped (time budget)", "-", f"--budget {args.budget:g} s")
            continue
        try:
            with time_limit(min(budget, left)):
                fn()
        except SectionTimeout as exc:
            table.add(name, "(rest of the section)", "timeout", str(exc), f"section budget {budget} s")
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            table.add(name, "(section)", "error", f"{type(exc).__name__}: {str(exc)[:160]}", "-")
        finally:
            if dev.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    watchdog.cancel()
    failed = sum(r[2] in ("FAIL", "error", "timeout") for r in table.rows)
    table.footer.append(f"{len(table.rows)} rows, {failed} failed or errored; total {time.monotonic() - start:.0f} s "
                        f"wall, imports included.")
    table.write()
    print("\n".join(table.footer))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(started=START))
