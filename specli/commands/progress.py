"""Progress and end-of-run summary on stderr (rich), for the batch commands."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specli.io.batch import Outcome


@dataclass
class RunSummary:
    """Counts and totals of one batch run."""

    ok: int = 0
    failed: int = 0
    skipped: int = 0
    audio_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    interrupted: bool = False  # the run was stopped (Ctrl-C) before every input was done

    def add(self, outcome: Outcome) -> None:
        if outcome.error:
            self.failed += 1
        elif outcome.skipped:
            self.skipped += 1
        else:
            self.ok += 1
            self.audio_seconds += outcome.result.stats.audio_seconds if outcome.result else 0.0

    def line(self) -> str:
        wall = time.perf_counter() - self.started
        rtf = wall / self.audio_seconds if self.audio_seconds else 0.0
        return (
            f"files: {self.ok} ok, {self.failed} failed, {self.skipped} skipped; "
            f"audio {self.audio_seconds / 3600:.3f} h; wall {wall:.1f} s; RTF {rtf:.3f}"
            + ("; interrupted" if self.interrupted else "")
        )


class BatchProgress:
    """A rich progress bar over audio seconds, shown only when asked or when stderr is a terminal."""

    def __init__(self, total_files: int, total_audio: float, show: bool | None = None) -> None:
        self.console = Console(stderr=True)
        self.show = sys.stderr.isatty() if show is None else show
        self._progress = Progress(
            TextColumn("{task.fields[files]}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} s audio"),
            TextColumn("RTF {task.fields[rtf]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.show,
        )
        self._task = self._progress.add_task("", total=max(total_audio, 1e-9), files=f"0/{total_files} files", rtf="-")
        self._total_files, self._done_files, self._done_audio = total_files, 0, 0.0
        self._t0 = time.perf_counter()

    def __enter__(self) -> BatchProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def window(self, seconds_in_file: float) -> None:
        done = self._done_audio + seconds_in_file
        rtf = (time.perf_counter() - self._t0) / done if done else 0.0
        self._progress.update(self._task, completed=done, rtf=f"{rtf:.3f}")

    def file_done(self, audio_seconds: float) -> None:
        self._done_files += 1
        self._done_audio += audio_seconds
        self._progress.update(self._task, completed=self._done_audio,
                              files=f"{self._done_files}/{self._total_files} files")

    def message(self, text: str) -> None:
        """One line on stderr, never wrapped or marked up (paths and reasons stay greppable)."""
        self.console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
