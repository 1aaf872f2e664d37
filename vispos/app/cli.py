"""The ``vispos`` command: its argument parser, and each subcommand's work loaded when it runs.

``vispos demo``: scikit-image's sample photos, batched with padding, through the default
config's backbone and position embedding; ``vispos demo --volume``: the same on volumes cut from
nilearn's MNI152 T1 template through a 3D ResNet; ``vispos run``: the same on the user's images
(``--images``) or NIfTI volumes (``--volumes``). All print a table per feature level and write
``embeddings.pt`` and ``figure.png``. ``vispos plot KIND``: one figure of an encoder.
``vispos config list`` / ``vispos config show NAME``: the configs that ship. ``vispos train``:
a small DETR trained on padded batches (2D, or 3D with ``--volume``). ``vispos --version``.

This module and the argument modules it reads (:mod:`vispos.app._run_args`,
:mod:`vispos.app._plot_args`, :mod:`vispos.app._config_command`, :mod:`vispos.app._train_args`)
import neither torch nor anything that does, so ``vispos --help`` and every
``vispos SUBCOMMAND --help`` answer at once
(``import vispos`` loads its API on first use, :mod:`vispos._lazy`). :func:`load_command` imports
a subcommand's work module (torch with it) only once its arguments are parsed and checked.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from .. import __version__
from ._config_command import add_config_parser
from ._errors import CLIError, OneLineParser
from ._flags import torch_threads
from ._io import Terminated
from ._plot_args import add_plot_parser, check_plot_args
from ._run_args import DEFAULT_CONFIG, DEFAULT_VOLUME_CONFIG, add_run_parsers, check_args
from ._train_args import add_train_parser, check_train_args, parse_train_args

__all__ = ["main", "DEFAULT_CONFIG", "DEFAULT_VOLUME_CONFIG", "load_command"]

#: subcommand -> (the module that does its work, imported when it runs; its argument check,
#: run before that import)
_COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], None] | None]] = {
    "demo": ("._run_command", check_args),
    "run": ("._run_command", check_args),
    "plot": ("._plot_command", check_plot_args),
    "config": ("._config_command", None),
    "train": ("._train_command", check_train_args),
}


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vispos",
        description="Position embeddings for padded batches of real images on a real backbone.",
    )
    parser.add_argument("--version", action="version", version=version_line(),
                        help="show the version and the folder of the vispos package that runs, and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parsers(sub)
    add_plot_parser(sub)
    add_config_parser(sub)
    add_train_parser(sub)
    return parser


def version_line() -> str:
    """``vispos VERSION from FOLDER``: what ``vispos --version`` prints, the folder being the
    package that runs (a second clone or install that took over the environment shows here)."""
    return f"vispos {__version__} from {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}"


def load_command(command: str) -> Callable[[argparse.Namespace], None]:
    """The function that runs ``command`` (``"demo"``, ``"run"``, ``"plot"``, ``"config"``, ``"train"``),
    its module imported: the point where the subcommand's own work starts (torch, the core
    and what the subcommand needs are imported here, not before).

    Raises:
        KeyError: ``command`` is not a subcommand.
    """
    module, _ = _COMMANDS[command]
    return importlib.import_module(module, __package__).execute


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML and torch errors span several)."""
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vispos`` command.

    Every error is printed to stderr as one line ``vispos COMMAND: error: ...`` (``vispos train:
    error: ...``: the prefix of argparse's own usage errors of that subcommand, so every message
    of one command starts alike; no traceback) and no output file is left behind, whole or
    partial. Returns the exit status: 0 ok, 2 a user error (bad arguments, files, configs:
    ``ValueError``, ``TypeError``, ``OSError``, ...), 1 any other failure (named by its exception
    type), 130 on Ctrl-C, 128 + the signal number on SIGTERM / SIGHUP while the outputs are
    written (143 for SIGTERM). argparse's own usage errors are one line too
    (:class:`~vispos.app._errors.OneLineParser`, no usage block) and exit with status 2 through
    ``SystemExit``. Every argument after ``train`` is the training's own
    (:func:`vispos.app._train_args.parse_train_args`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_train_args(argv[1:]) if argv[:1] == ["train"] else _parser().parse_args(argv)
    prefix = f"vispos {args.command}: error:"

    def show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # one line each
        print(f"vispos {args.command}: warning: {_one_line(message)}", file=sys.stderr if file is None else file)

    with warnings.catch_warnings():
        warnings.showwarning = show_warning
        return _run(args, prefix)


def _run(args: argparse.Namespace, prefix: str) -> int:
    """Runs the parsed command; every error is one line starting with ``prefix``."""
    try:
        _, check = _COMMANDS[args.command]
        if check is not None:
            check(args)  # before anything heavy is imported
        with torch_threads(getattr(args, "threads", None)):  # --threads; restored after the command
            load_command(args.command)(args)
    except (CLIError, ValueError, TypeError, FileNotFoundError, ImportError, OSError) as exc:
        print(f"{prefix} {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prefix} interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return 128 + exc.signum
    except Exception as exc:  # noqa: BLE001 - the command never shows a traceback
        print(f"{prefix} {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
