"""Corrupted files cannot crash, hang or fool the loaders (``vispos.data``).

A seeded corpus (``tests/fuzz_corpus.py``) of damaged copies of every format ``load_image`` and
``load_volume`` accept is read in child processes, many files per child; a child that dies or
stops answering is replaced by a new one that starts after the file it was reading, and that file
is then read again alone to confirm it. A file fails the test when its read crashes the process,
hangs, raises anything but the documented ``ValueError`` naming the file, or returns a tensor
outside the documented contract (float32, shape, finite, images in ``[0, 1]``), or of another
shape than its header announces (``displayed_size`` / ``volume_shape``, which the CLI bounds
batches with before decoding).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHILD = HERE / "fuzz_corpus.py"
SEED = 20261123
#: seconds one read may take before it counts as a hang (from the child's "start" line, so a
#: slow start of the child on a busy machine is not counted)
READ_TIMEOUT = float(os.environ.get("VISPOS_FUZZ_TIMEOUT", "30"))
#: seconds a child may take to start (python, then torch and vispos at its first read)
START_TIMEOUT = 300.0
#: exceptions the loaders document for a damaged file
DOCUMENTED = {"ValueError"}

sys.path.insert(0, str(HERE))
import fuzz_corpus  # noqa: E402


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _run_batch(jobs: list[dict], work: Path, timeout: float, env: dict) -> tuple[dict, dict | None]:
    """Runs one child over ``jobs``; returns ``({i: record}, failure)`` where ``failure`` is
    ``{"i", "why"}`` for the file the child died or hung in (None when it finished). A read that
    gives no answer within ``timeout`` seconds of its start is a hang; the child is killed."""
    import queue
    import threading

    list_file = work / f"jobs_{jobs[0]['i']}.json"
    list_file.write_text(json.dumps(jobs))
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(list_file)], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
    results, started, why = {}, None, None
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            proc.kill()
            why = f"no answer within {timeout if started is not None else START_TIMEOUT:.0f} s"
            break
        if line is None:  # the child closed its output: finished or died
            proc.wait()
            why = None if proc.returncode == 0 else f"exit status {proc.returncode}"
            break
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("start"):
            started = record["i"]
            deadline = time.monotonic() + timeout
        elif "i" in record:
            results[record["i"]] = record
    proc.wait()
    if why is None:
        return results, None
    if started is None or started in results:  # died outside a read (at import, say)
        raise RuntimeError(f"fuzz child failed before reading a file ({why}): {''.join(errors)[-2000:]}")
    return results, {"i": started, "why": f"{why}; stderr: {''.join(errors).strip()[-300:]}"}


def run_corpus(
    jobs: list[dict], work: Path, *, timeout: float = READ_TIMEOUT, env=None, max_crashes: int = 10
) -> dict:
    """Reads every job in as few children as possible; returns ``{i: record}`` where a crash or
    a hang is recorded as ``{"status": "crashed", "why": ...}`` (confirmed by a child of its own).
    After ``max_crashes`` crashes the rest is left unread (each costs two child starts: a broken
    decoder fails the test in bounded time)."""
    env = _env() if env is None else env
    results: dict[int, dict] = {}
    pending = list(jobs)
    crashes = 0
    while pending:
        if crashes >= max_crashes:
            break
        done, failure = _run_batch(pending, work, timeout, env)
        results.update(done)
        if failure is None:
            break
        i = failure["i"]
        alone, again = _run_batch([j for j in jobs if j["i"] == i], work, timeout, env)
        if again is None:  # it passes alone: the child died of an earlier file's damage
            results[i] = {"i": i, "status": "crashed", "why": failure["why"] + " (passes alone)"}
        else:
            results[i] = {"i": i, "status": "crashed", "why": again["why"]}
        pending = [j for j in pending if j["i"] > i]
        crashes += 1
    return results


def _problems(jobs: list[dict], results: dict) -> list[str]:
    out = []
    for job in jobs:
        rec = results.get(job["i"])
        name = Path(job["path"]).name
        if rec is None:
            out.append(f"{name}: not read (too many crashes before it)")
        elif rec["status"] == "crashed":
            out.append(f"{name}: crashed ({rec['why']})")
        elif rec["status"] == "bad":
            out.append(f"{name}: {rec['problem']}")
        elif rec["status"] == "raised":
            if rec["type"] not in DOCUMENTED:
                out.append(f"{name}: undocumented {rec['type']}: {rec['message'][:200]}")
            elif job["path"] not in rec["message"]:
                out.append(f"{name}: the message does not name the file: {rec['message'][:200]}")
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    records = fuzz_corpus.build_corpus(folder / "files", SEED)
    return folder, [dict(r, i=i) for i, r in enumerate(records)]


def test_corpus_covers_every_accepted_format(corpus):
    """Every format ``load_image`` accepts (as Pillow names them) and every NIfTI flavour
    ``load_volume`` accepts has a seed, and each seed has at least 30 damaged copies."""
    import collections

    import nibabel as nib
    from PIL import Image

    from vispos.app.data import IMAGE_FORMATS

    _, jobs = corpus
    seeds = {j["seed"]: j for j in jobs if Path(j["path"]).name == j["seed"]}
    formats = set()
    for name, job in seeds.items():
        if job["kind"] == "image":
            with Image.open(job["path"]) as im:
                formats.add(im.format)
    assert formats == set(IMAGE_FORMATS)
    flavours = {type(nib.load(j["path"])).__name__ for j in seeds.values() if j["kind"] == "volume"}
    assert flavours == {"Nifti1Image", "Nifti2Image", "Nifti1Pair"}
    assert any(j["path"].endswith(".nii.gz") for j in seeds.values())
    copies = collections.Counter(j["seed"] for j in jobs if j["kind"] == "image")
    assert min(copies.values()) >= 30, copies
    assert len({j["path"] for j in jobs}) > 2000


def test_damaged_files_never_crash_hang_or_return_bad_values(corpus):
    folder, jobs = corpus
    start = time.perf_counter()
    results = run_corpus(jobs, folder)
    problems = _problems(jobs, results)
    assert not problems, f"{len(problems)} of {len(jobs)} files:\n" + "\n".join(problems[:60])
    # the seeds themselves are read (a loader that refuses everything would pass the above)
    seeds_ok = [j for j in jobs if Path(j["path"]).name == j["seed"]]
    assert seeds_ok and all(results[j["i"]]["status"] == "ok" for j in seeds_ok), [
        (Path(j["path"]).name, results[j["i"]]) for j in seeds_ok if results[j["i"]]["status"] != "ok"
    ]
    assert time.perf_counter() - start < 120


def test_harness_reports_a_crash_and_a_hang_and_keeps_going(tmp_path):
    """The harness itself: a child that aborts or hangs is named (and confirmed alone), the files
    after it are still read in a new child, and an undocumented exception is reported."""
    jobs = [
        {"i": 0, "path": "a", "kind": "selftest-ok"},
        {"i": 1, "path": "abort", "kind": "selftest-crash"},
        {"i": 2, "path": "b", "kind": "selftest-ok"},
        {"i": 3, "path": "hang", "kind": "selftest-hang"},
        {"i": 4, "path": "c", "kind": "selftest-ok"},
        {"i": 5, "path": "missing.png", "kind": "selftest-raise"},
    ]
    results = run_corpus(jobs, tmp_path, timeout=3)
    assert [results[i]["status"] for i in range(6)] == ["ok", "crashed", "ok", "crashed", "ok", "raised"]
    assert "exit status -6" in results[1]["why"] and "no answer within 3 s" in results[3]["why"]
    problems = _problems(jobs, results)
    assert len(problems) == 3 and "undocumented FileNotFoundError" in problems[2]
