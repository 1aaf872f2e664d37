"""A command's progress through its stages, shown (tqdm, on stderr) only once the work has taken
longer than a delay: a quick run prints nothing, a long one (a 4000x3000 photo through a
ResNet-50 takes over a minute on a CPU) says which stage it is in and for how long.

A stage is one call that cannot report its own progress (the backbone's forward pass), so a
background thread refreshes the bar while it runs: the elapsed time keeps moving. torch-free.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["DELAY_S", "StageProgress"]

#: seconds of work before the bar appears
DELAY_S = 2.0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


class StageProgress:
    """Progress through named stages, e.g. ``with progress.stage("backbone"): ...``.

    Args:
        stages (sequence of str): every stage's name, in order (the bar's total).
        desc (str): the bar's label, e.g. ``"vispos run"``.
        delay (float): seconds before anything is shown (:data:`DELAY_S`).
        interval (float): seconds between refreshes while a stage runs.
        file (text stream, optional): where the bar goes; default ``sys.stderr``, and only when it
            is a terminal (a bar redrawn in place is noise in a log or a pipe).

    Raises:
        ValueError: no stage, a delay or interval below 0.
    """

    def __init__(self, stages: Sequence[str], desc: str, delay: float = DELAY_S, interval: float = 0.5,
                 file: TextIO | None = None) -> None:
        if not stages:
            raise ValueError("stages must name at least one stage, got none")
        if delay < 0 or interval <= 0:
            raise ValueError(f"delay must be >= 0 and interval > 0, got delay={delay}, interval={interval}")
        self.stages, self.desc, self.delay, self.interval = list(stages), desc, delay, interval
        self.file = file
        self.enabled = file is not None or _is_terminal(sys.stderr)
        self._bar: Any = None
        self._start = time.perf_counter()
        self._done = 0
        self._lock = threading.Lock()

    def _show(self, name: str) -> None:
        """Draws the bar (made on the first call after the delay) at the current stage."""
        with self._lock:
            if not self.enabled or time.perf_counter() - self._start < self.delay:
                return
            label = f"{self.desc}: now {name}"
            if self._bar is None:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=len(self.stages), initial=self._done, desc=label, unit="stage", leave=False,
                                 file=self.file if self.file is not None else sys.stderr,
                                 bar_format="{desc} ({n_fmt}/{total_fmt} stages done) [{elapsed}]")
                return
            self._bar.n = self._done
            self._bar.set_description_str(label, refresh=False)
            self._bar.refresh()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Runs the body as stage ``name``; the bar is refreshed every ``interval`` seconds meanwhile."""
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(self.interval):
                self._show(name)

        self._show(name)
        if not self.enabled:
            yield
            self._done += 1
            return
        ticker = threading.Thread(target=tick, name="vispos-progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()
            self._done += 1

    def close(self) -> None:
        """Removes the bar, if one was shown."""
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
