"""The work of ``vispos train``: the 2D or 3D DETR task run by the training core.

Imported only when ``vispos train`` runs (torch, the backbone libraries and the task's data
come with it); its arguments are parsed by :mod:`vispos.app._train_args`. The core parses them
again with every check that needs torch or the data (:func:`vispos.app.train.cli.run`): a flag it
refuses ends the program with one line naming the flag (exit status 2).
"""

from __future__ import annotations

import argparse

from ._train_args import PROG

__all__ = ["execute"]


def execute(args: argparse.Namespace) -> None:
    """Runs ``vispos train`` on arguments parsed by :func:`vispos.app._train_args.parse_train_args`:
    trains every ``--pos`` arm and writes the report (or only the report, ``--report``).

    Raises:
        ValueError, TypeError, OSError, ImportError: a bad file or setting found while training
            (:func:`vispos.app.cli.main` prints it as one line and exits with 2).
    """
    if getattr(args, "task", "detect") == "segment":
        from .train.segment3d import run as run_segment

        run_segment(args.train_argv, prog=PROG)
        return
    if args.volume:
        from .train.task3d import TASK
    else:
        from .train.task2d import TASK
    from .train.cli import run

    run(TASK, args.train_argv, prog=PROG, command=True)
