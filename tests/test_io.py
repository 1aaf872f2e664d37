"""vispos.app._io.write_files: a group of files written all or nothing (issue 12, items 1-3)."""

from __future__ import annotations

import os
import signal
import stat
import threading

import pytest

import vispos.app._io as vio
from vispos.app._io import Terminated, write_files


def _writer(text):
    def write(tmp):
        with open(tmp, "w") as fh:
            fh.write(text)

    return write


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def default_signals():
    """Each test starts with Python's default SIGINT / SIGTERM handlers (an earlier test in the
    session, e.g. a distributed one, may have installed its own), restored afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture
def umask():
    """Sets the process umask for one test and restores it."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def test_writes_every_file(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.png"
    assert write_files([(a, _writer("A")), (str(b), _writer("B"))]) == [str(a), str(b)]
    assert a.read_text() == "A" and b.read_text() == "B"
    assert sorted(os.listdir(tmp_path)) == ["a.pt", "b.png"]


def test_temporary_keeps_the_extension(tmp_path):
    seen = []
    write_files([(tmp_path / "figure.png", lambda tmp: (seen.append(tmp), open(tmp, "w").close()))])
    assert seen[0].endswith("figure.png") and os.path.basename(seen[0]).startswith(".vispos-")


def test_directory_target_is_refused_before_anything_is_replaced(tmp_path):
    """Item 1: with ``figure.png`` a directory, the old ``embeddings.pt`` is kept."""
    (tmp_path / "embeddings.pt").write_text("old")
    (tmp_path / "figure.png").mkdir()
    called = []
    with pytest.raises(IsADirectoryError, match="figure.png': it is a directory"):
        write_files([
            (tmp_path / "embeddings.pt", lambda tmp: called.append(tmp)),
            (tmp_path / "figure.png", lambda tmp: called.append(tmp)),
        ])
    assert called == []  # refused while preparing: no writer ran
    assert (tmp_path / "embeddings.pt").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["embeddings.pt", "figure.png"]


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_failed_rename_puts_old_files_back(tmp_path, monkeypatch, fail_at):
    """Item 1: whichever rename fails, every target holds its old content (or is absent, as
    before) and no hidden file remains."""
    (tmp_path / "a").write_text("old a")
    (tmp_path / "c").write_text("old c")  # b did not exist
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == fail_at + 1:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(vio.os, "replace", flaky)
    with pytest.raises(OSError, match="No space left"):
        write_files([(tmp_path / n, _writer("new " + n)) for n in "abc"])
    assert sorted(os.listdir(tmp_path)) == ["a", "c"]
    assert (tmp_path / "a").read_text() == "old a" and (tmp_path / "c").read_text() == "old c"


def test_failed_writer_leaves_nothing_and_removes_created_folders(tmp_path):
    out = tmp_path / "x" / "y"

    def broken(tmp):
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_files([(out / "a", _writer("A")), (out / "b", broken)], make_dirs=True)
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_files([(out / "a", _writer("A"))])


@pytest.mark.parametrize(
    "setup, match, exc",
    [
        (lambda d: None, "are the same file", ValueError),
        (lambda d: os.mkfifo(d / "a"), "is not a regular file", ValueError),
        (lambda d: (d / "a").write_text("x") or os.chmod(d / "a", 0o444), "is read-only", PermissionError),
        (lambda d: (d / "sub").write_text("x"), "exists and is not a folder", NotADirectoryError),
    ],
)
def test_bad_targets(tmp_path, setup, match, exc):
    setup(tmp_path)
    if match == "is read-only" and os.access(tmp_path / "a", os.W_OK):
        pytest.skip("running as root: every file is writable")
    targets = {
        "are the same file": [tmp_path / "a", tmp_path / "." / "a"],
        "exists and is not a folder": [tmp_path / "sub" / "a"],
    }.get(match, [tmp_path / "a"])
    with pytest.raises(exc, match=match):
        write_files([(t, _writer("new")) for t in targets], make_dirs=True)


def test_symlink_is_followed_as_open_follows_it(tmp_path):
    (tmp_path / "real.txt").write_text("old")
    os.symlink(tmp_path / "real.txt", tmp_path / "link.txt")
    write_files([(tmp_path / "link.txt", _writer("new"))])
    assert os.path.islink(tmp_path / "link.txt")
    assert (tmp_path / "real.txt").read_text() == "new"


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_new_files_get_the_mode_open_gives(tmp_path, umask, mask):
    """Item 3: not mkstemp's 0600, but 0666 & ~umask, as ``open()`` creates a file."""
    umask(mask)
    with open(tmp_path / "plain", "w"):
        pass
    write_files([(tmp_path / "ours", _writer("x"))])
    assert _mode(tmp_path / "ours") == _mode(tmp_path / "plain") == 0o666 & ~mask


@pytest.mark.parametrize("old_mode", [0o644, 0o600, 0o664])
def test_replaced_files_keep_their_mode_as_open_keeps_it(tmp_path, umask, old_mode):
    """Item 3: re-running over an old 0644 output leaves 0644 (``open(..., "w")`` truncates an
    existing file and keeps its mode, whatever the umask)."""
    umask(0o077)
    for name in ("plain", "ours"):
        (tmp_path / name).write_text("old")
        os.chmod(tmp_path / name, old_mode)
    with open(tmp_path / "plain", "w"):
        pass
    write_files([(tmp_path / "ours", _writer("new"))])
    assert _mode(tmp_path / "ours") == _mode(tmp_path / "plain") == old_mode
    assert (tmp_path / "ours").read_text() == "new"


@pytest.mark.parametrize("signum, exc", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
@pytest.mark.parametrize("when", ["writing", "renaming"])
def test_signal_rolls_back(tmp_path, monkeypatch, signum, exc, when):
    """Item 2: a signal in the middle of the group (after the first file was written, or after
    the first rename) leaves the old files and no temporary; the handlers are restored."""
    (tmp_path / "a").write_text("old a")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if when == "renaming":
        real = os.replace

        sent = []

        def replace_then_signal(src, dst):  # one signal, after the first rename only
            real(src, dst)
            if not sent:
                sent.append(signum)
                os.kill(os.getpid(), signum)

        monkeypatch.setattr(vio.os, "replace", replace_then_signal)
        writers = [(tmp_path / "a", _writer("new a")), (tmp_path / "b", _writer("new b"))]
    else:

        def write_then_signal(tmp):
            _writer("new b")(tmp)
            os.kill(os.getpid(), signum)

        writers = [(tmp_path / "a", _writer("new a")), (tmp_path / "b", write_then_signal),
                   (tmp_path / "c", _writer("new c"))]
    with pytest.raises(exc):
        write_files(writers)
    assert os.listdir(tmp_path) == ["a"] and (tmp_path / "a").read_text() == "old a"
    assert {s: signal.getsignal(s) for s in before} == before


def test_terminated_names_the_signal():
    exc = Terminated(signal.SIGTERM)
    assert str(exc) == "terminated by SIGTERM" and exc.signum == signal.SIGTERM
    assert not isinstance(exc, Exception)


def test_works_outside_the_main_thread(tmp_path):
    errors = []

    def run():
        try:
            write_files([(tmp_path / "a", _writer("A"))])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors == [] and (tmp_path / "a").read_text() == "A"


def test_a_second_signal_during_cleanup_is_held_then_delivered(tmp_path, monkeypatch):
    """SIGTERM raises; a second SIGTERM while the temporaries are removed does not cut the
    cleanup short, and is sent again once the previous handler is back (recorded here instead
    of killing pytest)."""
    resent = []
    monkeypatch.setattr(vio.os, "kill", lambda pid, signum: resent.append((pid, signum)))
    real_remove = vio._remove

    def remove_during_second_signal(path):
        signal.raise_signal(signal.SIGTERM)  # held back: the first one is being handled
        real_remove(path)

    monkeypatch.setattr(vio, "_remove", remove_during_second_signal)

    def write_then_term(tmp):
        _writer("new")(tmp)
        signal.raise_signal(signal.SIGTERM)

    with pytest.raises(Terminated):
        write_files([(tmp_path / "a", _writer("A")), (tmp_path / "b", write_then_term)])
    assert os.listdir(tmp_path) == []
    assert resent == [(os.getpid(), signal.SIGTERM)]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


# ------------------------------------------- replace=False: never replace a file (issue 32, 6)
def test_replace_false_refuses_an_existing_target_before_writing(tmp_path):
    (tmp_path / "b.txt").write_text("theirs")
    with pytest.raises(FileExistsError, match=r"cannot write '.*b.txt': it exists and is not to be replaced"):
        write_files([(tmp_path / "a.txt", _writer("a")), (tmp_path / "b.txt", _writer("b"))], replace=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt"]
    assert (tmp_path / "b.txt").read_text() == "theirs"
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")  # a name taken, though by nothing
    with pytest.raises(FileExistsError, match="dangling': it exists"):
        write_files([(tmp_path / "dangling", _writer("x"))], replace=False)


def test_replace_false_never_replaces_a_file_that_appears_meanwhile(tmp_path):
    """Another process creates the target while ours is written: its file stays, ours goes,
    and the group's other file (already given its name) is removed again."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"

    def write_and_race(tmp):
        with open(tmp, "w") as fh:
            fh.write("ours")
        second.write_text("theirs")  # appears after the check, before the commit

    with pytest.raises(FileExistsError, match="b.txt': it appeared while being written and is not to be replaced"):
        write_files([(first, _writer("a")), (second, write_and_race)], replace=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt"]
    assert second.read_text() == "theirs"


def test_replace_false_writes_new_files(tmp_path):
    assert write_files([(tmp_path / "a.txt", _writer("a"))], replace=False) == [str(tmp_path / "a.txt")]
    assert (tmp_path / "a.txt").read_text() == "a"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]
