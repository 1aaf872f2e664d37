"""The flags every ``vispos`` subcommand shares (vispos/app/_flags.py): ``--threads``."""

from __future__ import annotations

import os

import pytest
import torch

import vispos.app.cli as cli
from vispos.app import _flags


def test_threads_default_is_the_machines_and_said_so(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(_flags, "available_cores", lambda: 16)
    assert _flags.default_threads() == (4, "min(4, 16 cores)")
    monkeypatch.setattr(_flags, "available_cores", lambda: 2)
    assert _flags.default_threads() == (2, "min(4, 2 cores)")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    assert _flags.default_threads() == (3, "$OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert _flags.default_threads()[0] == 2


@pytest.mark.parametrize("command", ["run", "demo", "plot"])
def test_threads_flag_is_in_help(command, capsys, monkeypatch):
    """Before: only ``vispos train`` took ``--threads``."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--threads THREADS torch threads (default here: 3 = $OMP_NUM_THREADS;" in help_text


@pytest.mark.parametrize("argv", [
    ["run", "--images", "{img}", "--out", "{tmp}/o"],
    ["demo", "--out", "{tmp}/o"],
    ["plot", "similarity", "--out", "{tmp}/s.png"],
], ids=["run", "demo", "plot"])
def test_threads_flag_sets_torch_threads_for_the_command(argv, tmp_path, monkeypatch):
    """The command runs with ``torch.get_num_threads() == --threads``; the number before is back
    afterwards (``main`` may be called in a process that keeps running)."""
    (tmp_path / "a.png").write_bytes(b"")
    argv = [a.format(img=tmp_path / "a.png", tmp=tmp_path) for a in argv]
    seen = []
    monkeypatch.setattr(cli, "load_command", lambda command: lambda args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    want = 2 if before != 2 else 3
    assert cli.main([*argv, "--threads", str(want)]) == 0
    assert seen == [want] and torch.get_num_threads() == before
    with pytest.raises(SystemExit) as info:  # at least 1: argparse's one-line error
        cli.main([*argv, "--threads", "0"])
    assert info.value.code == 2


def test_train_shares_the_flag():
    from vispos.app._train_args import parse_train_args

    assert parse_train_args(["--threads", "2"]).threads == 2 and parse_train_args([]).threads == 0
    assert os.path.basename(_flags.__file__) == "_flags.py"


@pytest.mark.parametrize("argv", [
    ["run", "--images", "{img}", "--out", "{tmp}/o"],
    ["demo", "--out", "{tmp}/o"],
    ["plot", "similarity", "--out", "{tmp}/s.png"],
    ["train"],
], ids=["run", "demo", "plot", "train"])
@pytest.mark.parametrize("threads", ["3000000000", "1025", "2147483647"])
def test_threads_beyond_the_bound_is_one_line_exit_2(argv, threads, tmp_path, monkeypatch, capsys):
    """Before: ``--threads 3000000000`` reached ``torch.set_num_threads`` and ended in its
    'Overflow when unpacking long' traceback; ``2147483647`` was set as it was."""
    (tmp_path / "a.png").write_bytes(b"")
    argv = [a.format(img=tmp_path / "a.png", tmp=tmp_path) for a in argv]
    monkeypatch.setattr(cli, "load_command", lambda command: lambda args: pytest.fail("the command ran"))
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--threads", threads])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].endswith(f"argument --threads: must be <= {_flags.MAX_THREADS}, got {threads}"), lines
    assert "Traceback" not in "\n".join(lines)
    assert "--threads" in lines[-1]
