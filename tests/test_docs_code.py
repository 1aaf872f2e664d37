"""Every ```python block of README.md and docs/**/*.md runs as pasted (issue 32, item 2).

Each block runs in a fresh interpreter (this interpreter's executable, i.e. the venv's python)
whose working directory is an empty temporary directory outside the checkout, so a path such as
``"configs/x.yaml"`` does not resolve against the repository. Only the checkout's ``vispos``
package is put on the path (a symlink to it, nothing else of the checkout: ``demos`` or
``tests`` do not import), the caches (torch hub, Hugging Face, scikit-image's downloads) are
empty directories and every proxy points at a closed port, so a block that downloads fails.
A ``DeprecationWarning`` or ``FutureWarning`` raised for the block's own code is an error: the
docs teach the current names.

Markers, each an HTML comment on its own line right above the opening fence (several may
stack); mkdocs and GitHub show nothing of them:

``<!-- docs-test: skip: REASON -->``
    The block is not run (it needs the reader's own files, a GPU, several processes). REASON is
    the skip reason pytest reports (``-ra``) and must also be written in the page's visible text
    between the previous fenced block and this one, so the reader is told too.
``<!-- docs-test: continues -->``
    The block continues the previous python block of the same page: the chain runs as one script
    in one interpreter, and each block of it is one test (it passes when the chain got past it).
    A block that continues a skipped block is skipped with it.

Blocks run two at a time (``VISPOS_DOCS_TEST_JOBS`` changes it), each with
``OMP_NUM_THREADS`` set to its share of the cores; each chain has its own directory, so nothing
is shared between them but matplotlib's font cache (which matplotlib locks).
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: seconds a chain of blocks may run (one process); docs examples are meant to take seconds
TIMEOUT = 240
PYTHON_LANGS = {"python", "py", "python3"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
_MARKER = re.compile(r"^[ \t]*<!--[ \t]*docs-test:[ \t]*(?P<body>.*?)[ \t]*-->[ \t]*$")
_COMMENT = re.compile(r"<!--.*?-->", re.S)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced python block: where it is, its code (dedented), its markers."""

    path: str       # relative to the root, posix
    line: int       # 1-based line of the opening fence
    code: str
    skip: str | None = None
    continues: bool = False
    chain: tuple[str, ...] = ()   # ids of the blocks run before it in the same process

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md and every .md under docs/ (every page, in the nav or not)."""
    files = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def _plain(text: str) -> str:
    """Visible prose, compared loosely: comments, markdown emphasis and line breaks removed."""
    text = _COMMENT.sub(" ", text)
    text = re.sub(r"[`*_]", "", text)
    return re.sub(r"\s+", " ", text).strip().lower()


def _read_markers(pending: list[tuple[int, str]], prose: str, where: str
                  ) -> tuple[str | None, bool, list[str]]:
    """The skip reason and the continues flag of the markers above one python block."""
    skip, continues, problems = None, False, []
    for number, body in pending:
        if body == "continues":
            continues = True
        elif body.startswith("skip:") and body[5:].strip():
            skip = body[5:].strip()
            if _plain(skip) not in _plain(prose):
                problems.append(f"{where}: the skip reason '{skip}' is not written in the page's "
                                "text above the block (the reader must be told too)")
        else:
            problems.append(f"{where.rsplit(':', 1)[0]}:{number}: unknown marker '{body}' "
                            "(expected 'skip: REASON' or 'continues')")
    return skip, continues, problems


def _fence_end(lines: list[str], start: int, opener: str) -> int:
    """The index of the line closing the fence opened at ``start`` (len(lines) if unclosed)."""
    for end in range(start + 1, len(lines)):
        close = _FENCE.match(lines[end])
        if close and not close.group("info") and close.group("fence")[0] == opener[0] \
                and len(close.group("fence")) >= len(opener):
            return end
    return len(lines)


def parse_blocks(text: str, path: str) -> tuple[list[Block], list[str]]:
    """The python blocks of one markdown text, and the problems found with its markers.

    Fences of every language are tracked (a python fence inside a ````markdown example is not a
    block); a fence may be indented (lists, admonitions) and the code is dedented by as much.
    """
    lines = text.split("\n")
    blocks: list[Block] = []
    problems: list[str] = []
    prose_start = 0                        # first line after the previous fenced block
    pending: list[tuple[int, str]] = []    # markers seen right above the current line

    def unattached(why: str) -> None:
        problems.extend(f"{path}:{n}: marker '{body}' {why}" for n, body in pending)
        pending.clear()

    i = 0
    while i < len(lines):
        marker, fence = _MARKER.match(lines[i]), _FENCE.match(lines[i])
        if marker:
            pending.append((i + 1, marker.group("body")))
            i += 1
            continue
        if not fence:
            unattached("is not right above a ```python fence")
            i += 1
            continue
        indent, opener, info = fence.group("indent"), fence.group("fence"), fence.group("info")
        lang = info.split()[0].strip("{}.").lower() if info else ""
        end = _fence_end(lines, i, opener)
        if lang not in PYTHON_LANGS:
            unattached(f"is above a '{lang or 'plain'}' fence, not a python one")
        else:
            where = f"{path}:{i + 1}"
            prose = "\n".join(lines[prose_start:pending[0][0] - 1 if pending else i])
            skip, continues, bad = _read_markers(pending, prose, where)
            problems += bad
            pending.clear()
            body = lines[i + 1:end]
            code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                             for ln in body) + "\n"
            try:
                ast.parse(code)
            except SyntaxError as exc:
                problems.append(f"{path}:{i + 1 + (exc.lineno or 0)}: not valid Python on its own: "
                                f"{exc.msg}")
            chain: tuple[str, ...] = ()
            if continues and not blocks:
                problems.append(f"{where}: 'continues' but no python block comes before it")
            elif continues:
                prev = blocks[-1]
                chain = prev.chain + (prev.id,)
                if skip is None and prev.skip is not None:
                    skip = f"continues {prev.id}, which is skipped: {prev.skip}"
            blocks.append(Block(path, i + 1, code, skip, continues, chain))
        i = end + 1
        prose_start = i
    unattached("is not right above a ```python fence")
    return blocks, problems


def collect(root: Path = ROOT) -> tuple[list[Block], list[str]]:
    blocks, problems = [], []
    for file in markdown_files(root):
        text = file.read_text(encoding="utf-8")
        found, bad = parse_blocks(text, file.relative_to(root).as_posix())
        blocks += found
        problems += bad
    return blocks, problems


BLOCKS, PROBLEMS = collect()
BY_ID = {b.id: b for b in BLOCKS}


# --- running ------------------------------------------------------------------------------

@dataclasses.dataclass
class ChainRun:
    """What one interpreter did with a chain: the blocks it got past, its output, its time."""

    ids: tuple[str, ...]
    passed: dict[str, float]   # block id -> seconds the block took
    returncode: int | None     # None: killed at the timeout
    output: str
    seconds: float


def script(chain: list[Block], progress: Path) -> tuple[str, dict[int, tuple[str, int]]]:
    """One script for a chain: each block's code between two lines that append to ``progress``
    (an absolute path) that the block started and that it passed.

    Returns the script and its line map (script line -> (markdown path, markdown line)), used
    to point tracebacks at the page.
    """
    out: list[str] = []
    where: dict[int, tuple[str, int]] = {}

    def mark(what: str, ident: str) -> str:
        return (f'with open({str(progress)!r}, "a") as _docs_test_f: _docs_test_f.write('
                f'"{what} %.6f {ident}\\n" % __import__("time").perf_counter())')

    for block in chain:
        out.append(mark("start", block.id))
        for k, code_line in enumerate(block.code.rstrip("\n").split("\n")):
            out.append(code_line)
            where[len(out)] = (block.path, block.line + 1 + k)
        out.append(mark("passed", block.id))
    out.append("del _docs_test_f")
    return "\n".join(out) + "\n", where


def _environment(scratch: Path, pkg_dir: Path, threads: int) -> dict[str, str]:
    dropped = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in dropped}
    env["PYTHONPATH"] = str(pkg_dir)
    env["MPLBACKEND"] = "Agg"
    env["MPLCONFIGDIR"] = str(scratch / "mpl")
    for key in ("TORCH_HOME", "HF_HOME", "XDG_CACHE_HOME", "KERAS_HOME", "NILEARN_DATA"):
        env[key] = str(scratch / "cache" / key.lower())
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        env[key] = "http://127.0.0.1:9"   # the discard port: any download fails at once
    env["no_proxy"] = env["NO_PROXY"] = "localhost,127.0.0.1"
    env["PYTHONWARNINGS"] = "error::DeprecationWarning:__main__,error::FutureWarning:__main__"
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def run_chain(chain: list[Block], workdir: Path, scratch: Path, pkg_dir: Path, threads: int = 1,
              timeout: float = TIMEOUT) -> ChainRun:
    """Runs one chain as ``python docs_block.py`` in ``workdir`` (empty, outside the checkout).

    The process gets a session of its own: at the timeout it is killed with everything it
    started (DataLoader workers included).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    progress = workdir.parent / f"{workdir.name}.progress"   # not in the block's directory
    source, where = script(chain, progress.resolve())
    path = workdir / "docs_block.py"
    path.write_text(source, encoding="utf-8")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, path.name], cwd=workdir,
                            env=_environment(scratch, pkg_dir, threads), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        returncode = None
    seconds = time.perf_counter() - start
    passed: dict[str, float] = {}
    started: dict[str, float] = {}
    lines = progress.read_text(encoding="utf-8").splitlines() if progress.exists() else []
    for line in lines:
        what, clock, ident = line.split(" ", 2)
        if what == "start":
            started[ident] = float(clock)
        else:
            passed[ident] = float(clock) - started[ident]

    def to_page(match: re.Match) -> str:
        page, number = where.get(int(match.group(1)), (path.name, int(match.group(1))))
        return f'File "{page}", line {number}'

    output = re.sub(r'File "[^"]*docs_block\.py", line (\d+)', to_page, output)
    return ChainRun(tuple(b.id for b in chain), passed, returncode, output, seconds)


def _jobs() -> int:
    value = os.environ.get("VISPOS_DOCS_TEST_JOBS")
    if value:
        return max(1, int(value))
    return max(1, min(2, os.cpu_count() or 1))


@pytest.fixture(scope="module")
def pkg_dir(tmp_path_factory) -> Path:
    """A directory holding only a link to the checkout's ``vispos`` (the code under test)."""
    out = tmp_path_factory.mktemp("docs_pkg")
    (out / "vispos").symlink_to(ROOT / "vispos", target_is_directory=True)
    return out


@pytest.fixture(scope="module")
def docs_runs(request, tmp_path_factory, pkg_dir) -> dict[str, ChainRun]:
    """Runs the chains of the selected block tests (only those), a few at a time."""
    wanted = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        block = callspec.params.get("block") if callspec else None
        if isinstance(block, Block) and block.skip is None and item.module is request.module:
            wanted.append(block)
    # a chain ends at its last selected block: running it covers every block before it
    ends: dict[str, Block] = {}
    for block in wanted:
        head = block.chain[0] if block.chain else block.id
        if head not in ends or len(block.chain) > len(ends[head].chain):
            ends[head] = block
    scratch = tmp_path_factory.mktemp("docs_scratch")
    jobs = _jobs()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    runs: dict[str, ChainRun] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {}
        # longest chains first, so that the last one to start is a short one
        for n, end in enumerate(sorted(ends.values(), key=lambda b: (-len(b.chain), b.id))):
            chain = [BY_ID[i] for i in end.chain] + [end]
            workdir = tmp_path_factory.mktemp(f"docs_block{n}")
            assert ROOT not in workdir.resolve().parents, workdir   # outside the checkout
            futures[pool.submit(run_chain, chain, workdir, scratch, pkg_dir, threads)] = workdir
        for future in concurrent.futures.as_completed(futures):
            run, workdir = future.result(), futures[future]
            for ident in run.ids:
                runs[ident] = run
            if run.returncode == 0:   # what a passing chain wrote (checkpoints) is not kept
                shutil.rmtree(workdir, ignore_errors=True)
    return runs


# --- tests --------------------------------------------------------------------------------

def test_markers_are_well_formed():
    """Every marker is known, sits right above a python fence, and a skip is told to the reader."""
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_every_page_is_scanned():
    assert BLOCKS, "no ```python block found"
    assert {b.path for b in BLOCKS} >= {"README.md"}
    assert all(p.suffix == ".md" for p in markdown_files())


def _block_params(blocks: list[Block]) -> list:
    """One param per block. A block that runs in an interpreter of its own (no chain) and whose
    code another such block starts with, word for word (an earlier one if the code is the same),
    runs under ``exhaustive`` only: that block runs the same statements first, by default."""
    def fresh(b: Block) -> bool:
        return b.skip is None and not b.chain

    def covered(i: int, b: Block) -> bool:
        if not fresh(b) or any(o.chain and o.chain[0] == b.id for o in blocks):
            return False
        return any(j != i and fresh(a) and a.code.startswith(b.code) and (a.code != b.code or j < i)
                   and not a.code[len(b.code):][:1].isspace()  # the rest starts a new statement
                   for j, a in enumerate(blocks))

    return [pytest.param(b, id=b.id, marks=pytest.mark.exhaustive if covered(i, b) else ())
            for i, b in enumerate(blocks)]


@pytest.mark.slow
@pytest.mark.parametrize("block", _block_params(BLOCKS))
def test_block_runs_as_pasted(block: Block, docs_runs):
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    run = docs_runs[block.id]
    if block.id in run.passed:
        return
    chain = " -> ".join(run.ids)
    failed_first = next((i for i in run.ids if i not in run.passed), None)
    if run.returncode is None:
        why = f"timed out after {TIMEOUT} s"
    elif failed_first != block.id:
        why = f"an earlier block of its chain failed ({failed_first})"
    else:
        why = f"exit status {run.returncode}"
    pytest.fail(f"{block.id} does not run as pasted: {why}\nchain: {chain}\n{run.output[-6000:]}",
                pytrace=False)


# --- the harness itself ---------------------------------------------------------------------

PAGE = """\
# A page

Some text.

```python
x = 1
```

<!-- docs-test: continues -->
```python
assert x == 1
```

This one needs your own NIfTI files (`files`).

<!-- docs-test: skip: needs your own NIfTI files -->
```python
load(files)
```

<!-- docs-test: continues -->
```python
more(files)
```

````markdown
```python
not a block
```
````

- a list item:

    ```python
    y = 2
    ```
"""


def test_parser_reads_markers_chains_and_nesting():
    blocks, problems = parse_blocks(PAGE, "page.md")
    assert problems == []
    assert [(b.line, b.code, b.skip, b.chain) for b in blocks] == [
        (5, "x = 1\n", None, ()),
        (10, "assert x == 1\n", None, ("page.md:5",)),
        (17, "load(files)\n", "needs your own NIfTI files", ()),
        (22, "more(files)\n", "continues page.md:17, which is skipped: needs your own NIfTI files",
         ("page.md:17",)),
        (34, "y = 2\n", None, ()),
    ]


@pytest.mark.parametrize("page, problem", [
    ("<!-- docs-test: skip: needs a GPU -->\n```python\nx = 1\n```\n",
     "page.md:2: the skip reason 'needs a GPU' is not written in the page's text"),
    ("<!-- docs-test: skipp: typo -->\n```python\nx = 1\n```\n",
     "page.md:1: unknown marker 'skipp: typo'"),
    ("<!-- docs-test: continues -->\n\n```python\nx = 1\n```\n",
     "page.md:1: marker 'continues' is not right above a ```python fence"),
    ("<!-- docs-test: continues -->\n```python\nx = 1\n```\n",
     "page.md:2: 'continues' but no python block comes before it"),
    ("<!-- docs-test: continues -->\n```bash\nls\n```\n",
     "page.md:1: marker 'continues' is above a 'bash' fence"),
    ("```python\nfor x in y:\n```\n", "page.md:2: not valid Python on its own"),
])
def test_parser_reports_bad_markers(page, problem):
    _, problems = parse_blocks(page, "page.md")
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_runner_reports_the_failing_block_at_its_page_line(tmp_path, pkg_dir):
    page = ("```python\nimport os\nx = os.getcwd()\n```\n\n<!-- docs-test: continues -->\n"
            "```python\ny = 1\nundefined_name\n```\n")
    blocks, _ = parse_blocks(page, "page.md")
    run = run_chain(blocks, tmp_path / "work", tmp_path / "scratch", pkg_dir, timeout=60)
    assert run.returncode == 1
    assert set(run.passed) == {"page.md:1"}
    assert 'File "page.md", line 9' in run.output
    assert "NameError: name 'undefined_name'" in run.output


def test_runner_isolates_the_block(tmp_path, pkg_dir):
    """Nothing of the checkout resolves (no cwd, no demos), vispos is the checkout's, no network."""
    code = ("import os, sys, importlib.util, urllib.request, vispos\n"
            f"assert os.getcwd() != {str(ROOT)!r} and not os.path.exists('configs')\n"
            f"assert vispos.__file__.startswith({str(pkg_dir)!r}), vispos.__file__\n"
            "assert importlib.util.find_spec('demos') is None\n"
            "try:\n    urllib.request.urlopen('http://example.com', timeout=5)\n"
            "except OSError:\n    pass\nelse:\n    raise SystemExit('downloaded')\n"
            "import warnings\nwarnings.warn('old name', DeprecationWarning)\n")
    run = run_chain([Block("page.md", 1, code)], tmp_path / "work", tmp_path / "scratch", pkg_dir,
                    timeout=120)
    assert run.returncode == 1 and "DeprecationWarning: old name" in run.output, run.output
    assert 'File "page.md", line 13' in run.output


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to see the child end")
def test_runner_kills_a_hanging_block_with_its_children(tmp_path, pkg_dir):
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "open('child.pid', 'w').write(str(child.pid))\n"
            "time.sleep(120)\n")
    run = run_chain([Block("page.md", 1, code)], tmp_path / "work", tmp_path / "scratch", pkg_dir,
                    timeout=5)
    assert run.returncode is None and run.passed == {} and run.seconds < 60
    pid = int((tmp_path / "work" / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _undefined_names(code: str) -> list[str]:
    """Names ``code`` reads that it never binds (imports, assignments, definitions, arguments)
    and that are not builtins: what a block pasted alone would fail on. Scopes are not told
    apart (a name bound anywhere counts as bound), so it errs towards passing."""
    import builtins

    tree = ast.parse(code)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
    return sorted(n for n in read - bound if not hasattr(builtins, n))


def test_blocks_pasted_alone_import_what_they_use_and_continued_ones_say_so():
    """A block that continues an earlier one says so on its first line (``# continues the block
    above...``: the ``docs-test`` marker is an HTML comment no reader sees); every other block,
    skipped or not, binds or imports every name it reads. Before: the rotary page's second block
    used ``torch``, ``vispos`` and ``model`` from the first with no word of it."""
    problems = []
    for page in markdown_files():
        blocks, _ = parse_blocks(page.read_text(), page.relative_to(ROOT).as_posix())
        for block in blocks:
            first = next((line for line in block.code.splitlines() if line.strip()), "")
            if block.continues:
                if not first.startswith("# continues"):
                    problems.append(f"{block.id}: continues an earlier block but its first line, {first!r}, "
                                    "does not say so (start it with '# continues the block above: ...')")
                continue
            try:
                missing = _undefined_names(block.code)
            except SyntaxError:
                continue  # test_block_runs_as_pasted reports it
            if missing:
                problems.append(f"{block.id}: uses {missing} without importing or defining them")
    assert problems == []


def test_undefined_names_finds_what_a_block_does_not_import():
    assert _undefined_names("x = torch.zeros(3)\nprint(x, y)") == ["torch", "y"]
    assert _undefined_names("import torch\nfrom a.b import c as d\ndef f(v):\n    return d(v)\nf(torch)") == []
