"""Writing a group of files all or nothing (private).

:func:`write_files` is the one place vispos writes files: the CLI's ``embeddings.pt`` and
``figure.png`` as a group, and every PNG of :mod:`vispos.app.png` as a group of one.

How a group is written:

1. **Prepare, before anything is replaced.** Every target is checked: two targets may not be the
   same file, none may be one of the caller's inputs (``keep``: the files the outputs were made
   from), none may be a directory or another non-regular file, and every parent folder must
   exist (or is created, when ``make_dirs``). A symbolic link is followed, as a plain ``open()``
   follows it.
2. **Write.** Each writer fills a hidden temporary file (``.vispos-<random>.<name>.tmp``) in its
   target's folder. The temporary is created with mode ``0o666`` masked by the process umask,
   exactly what ``open(path, "w")`` creates, or with the old file's permission bits when it
   replaces one (what ``open()`` keeps when it truncates); each is flushed to disk (``fsync``).
3. **Commit.** Old targets are first hard-linked (copied where links are not supported) to hidden
   backups; then the temporaries are renamed over the targets one by one. If a rename fails, the
   targets already replaced get their backups back (or are removed, where there was none), so
   the folder holds exactly what it held before. The backups are removed at the end.

On any failure, or on ``SIGINT`` / ``SIGTERM`` / ``SIGHUP`` while the group is written (handled
only in the main thread, and only where the signal has its default handler), the temporaries,
the backups and the folders this call created are removed, and the error (``KeyboardInterrupt``
for SIGINT, :class:`Terminated` for the others) propagates. ``SIGKILL`` and power loss cannot be
handled: at worst they leave a hidden ``.vispos-*`` temporary next to intact targets.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterator, Sequence

__all__ = ["Terminated", "same_file", "write_files"]

_PREFIX = ".vispos-"


class Terminated(BaseException):
    """Raised in the main thread by SIGTERM / SIGHUP while :func:`write_files` runs.

    A ``BaseException`` (as ``KeyboardInterrupt`` is), so ``except Exception`` does not swallow it.

    Attributes:
        signum (int): the signal received.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt``, SIGTERM / SIGHUP raise :class:`Terminated`, the first
    time; a later signal, while the cleanup runs, is held back so the cleanup is not cut short,
    and sent again once the previous handlers are restored. Does nothing outside the main
    thread (Python runs signal handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"raised": False, "closing": False}
    held: list[int] = []

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        if state["raised"] or state["closing"]:
            if signum not in held:
                held.append(signum)
            return
        state["raised"] = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    if hasattr(signal, "SIGHUP"):
        wanted[signal.SIGHUP] = signal.SIG_DFL
    previous = {}
    try:
        for signum, default in wanted.items():
            if signal.getsignal(signum) is default:
                previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        state["closing"] = True
        for signum, old in previous.items():
            signal.signal(signum, old)
        for signum in held:  # not lost: delivered to the restored handler
            os.kill(os.getpid(), signum)


def _temp_path(folder: str, name: str, kind: str) -> str:
    """A hidden name next to ``name`` that keeps its extension (some writers read it)."""
    return os.path.join(folder, f"{_PREFIX}{secrets.token_hex(6)}.{kind}-{name[-80:]}")


def _create(path: str, mode: int | None) -> None:
    """Creates an empty file as ``open(path, "w")`` would (0o666 & ~umask), or with ``mode``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):  # not every platform / file system syncs a folder
        _fsync(folder)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _missing_dirs(folder: str) -> list[str]:
    """The folders ``os.makedirs(folder)`` would create, outermost first."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing[::-1]


def same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same path once symbolic links are
    followed, or (both existing) the same device and inode (a hard link, another mount)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _prepare(
    paths: Sequence[str], make_dirs: bool, replace: bool = True, keep: Sequence[str] = ()
) -> tuple[list[str], list[int | None], list[str]]:
    """Resolves and checks every target before anything is written; returns the resolved
    targets, the mode of each one's temporary (None: as ``open()`` creates it) and the folders
    that will have to be created."""
    targets, modes, to_create, seen = [], [], [], {}
    for path in paths:
        target = os.path.realpath(path)  # follow a symlink, as open() does
        if target in seen:
            raise ValueError(f"outputs {seen[target]!r} and {path!r} are the same file")
        seen[target] = path
        for source in keep:
            if same_file(path, source):
                raise ValueError(
                    f"cannot write {path!r}: it is the input {source!r}, which is never replaced; "
                    "write the outputs somewhere else"
                )
        try:
            st = os.stat(target)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"cannot write {path!r}: it is a directory")
        if not replace and (st is not None or os.path.lexists(path)):
            raise FileExistsError(f"cannot write {path!r}: it exists and is not to be replaced")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ValueError(f"cannot write {path!r}: it exists and is not a regular file")
        if st is not None and not os.access(target, os.W_OK):  # open() would refuse it too
            raise PermissionError(f"cannot write {path!r}: the file is read-only")
        folder = os.path.dirname(target)
        missing = _missing_dirs(folder)
        if missing and not make_dirs:
            raise FileNotFoundError(f"cannot write {path!r}: folder {folder!r} does not exist")
        for m in missing:
            if os.path.lexists(m):
                raise NotADirectoryError(f"cannot write {path!r}: {m!r} exists and is not a folder")
            if m not in to_create:
                to_create.append(m)
        targets.append(target)
        modes.append(None if st is None else stat.S_IMODE(st.st_mode) & 0o777)
    return targets, modes, to_create


def _backup(target: str, backup: str) -> None:
    try:
        os.link(target, backup)
    except OSError:  # no hard links on this file system
        shutil.copy2(target, backup)


def _link_new(tmp: str, target: str, path: str) -> None:
    """Gives ``tmp`` the name ``target`` only if nothing has that name: ``link(2)`` refuses an
    existing name atomically; where hard links are not supported, a check then a rename."""
    taken = f"cannot write {path!r}: it appeared while being written and is not to be replaced"
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise FileExistsError(taken) from None
    except OSError:  # no hard links on this file system
        if os.path.lexists(target):
            raise FileExistsError(taken) from None
        os.replace(tmp, target)


def write_files(
    outputs: Sequence[tuple[str | os.PathLike, Callable[[str], object]]], *, make_dirs: bool = False,
    replace: bool = True, keep: Sequence[str | os.PathLike] = (),
) -> list[str]:
    """Writes every file of a group, or none of them.

    Args:
        outputs (sequence of (path, writer)): ``writer(tmp)`` writes the whole content of
            ``path`` to the file ``tmp`` (which already exists, empty, in ``path``'s folder);
            for example ``lambda tmp: torch.save(obj, tmp)``.
        make_dirs (bool): create missing parent folders (removed again on failure).
        replace (bool): replace existing targets (the default). False: an existing target is
            refused before anything is written, and a target that appears meanwhile is never
            replaced (each file is given its name by ``link(2)``, which refuses an existing name).
        keep (sequence of paths): files that must never be written, whatever ``replace`` says
            (the inputs the outputs are made from); a target that is one of them (by path,
            symbolic link or hard link) is refused before anything is written.

    Returns:
        list of str: the paths written, as given.

    Raises:
        ValueError: two outputs are the same file; a target is one of ``keep``; a target exists
            and is not a regular file.
        FileExistsError: ``replace`` is False and a target exists (or appeared meanwhile).
        IsADirectoryError: a target is a directory (checked before anything is written).
        PermissionError: a target exists and is read-only (as ``open()`` would refuse it).
        FileNotFoundError: a parent folder is missing and ``make_dirs`` is False.
        OSError: creating, writing or renaming failed (everything is rolled back first).
        Terminated: SIGTERM / SIGHUP arrived (everything was rolled back).
        KeyboardInterrupt: SIGINT arrived (everything was rolled back).
        Exception: whatever a writer raised (everything was rolled back).

    References:
        POSIX ``rename(2)`` (atomic replacement within one file system); the write-to-temporary,
        fsync, rename pattern of SQLite's and git's lock files.
    """
    paths = [os.fspath(p) for p, _ in outputs]
    created: list[str] = []
    temps: list[str] = []
    backups: dict[str, str] = {}
    replaced: list[str] = []
    with _signals_raise():
        try:
            targets, modes, to_create = _prepare(paths, make_dirs, replace, [os.fspath(k) for k in keep])
            # each path is recorded before it is made, so a signal in between leaves nothing
            for folder in to_create:
                created.append(folder)
                os.mkdir(folder)
            for (_, writer), target, mode in zip(outputs, targets, modes):
                tmp = _temp_path(os.path.dirname(target), os.path.basename(target), "tmp")
                temps.append(tmp)
                _create(tmp, mode)
                writer(tmp)
                _fsync(tmp)
            for target in targets:
                if os.path.exists(target):
                    backups[target] = _temp_path(os.path.dirname(target), os.path.basename(target), "bak")
                    _backup(target, backups[target])
            for tmp, target, path in zip(temps, targets, paths):
                if replace:
                    replaced.append(target)  # rolling back a target not yet replaced is harmless
                    os.replace(tmp, target)
                else:
                    _link_new(tmp, target, path)
                    replaced.append(target)  # only once it is ours: another's file stays
                    _remove(tmp)
            for folder in {os.path.dirname(t) for t in targets}:
                _fsync_dir(folder)
        except BaseException:
            _rollback(replaced, backups)
            for tmp in temps:
                _remove(tmp)
            for folder in reversed(created):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            raise
        for backup in backups.values():
            _remove(backup)
    return paths


def _rollback(replaced: list[str], backups: dict[str, str]) -> None:
    """Puts back the old content of every target already replaced and removes the backups (a
    backup whose restore failed stays next to its target)."""
    for target in reversed(replaced):
        backup = backups.get(target)
        try:
            if backup is None:
                _remove(target)
            else:
                # rename(2) does nothing when both names are links to one file (the target
                # was not replaced yet): the backup is removed below in every case
                os.replace(backup, target)
        except OSError:  # pragma: no cover - the backup stays next to the target
            backups.pop(target)
    for backup in backups.values():
        _remove(backup)
