"""Live progress on a terminal (rich): bytes, rate, ETA and the current thread counts."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)


class LiveProgress:
    """A context manager whose instance is the ``progress`` callback of a transfer."""

    def __init__(self, label: str = "transfer", console: Optional[Console] = None):
        self.console = console or Console(stderr=False)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeRemainingColumn(), TextColumn("threads r/n/w {task.fields[threads]}"),
            TextColumn("files {task.fields[files]}"), console=self.console, transient=False,
            refresh_per_second=4)
        self.label = label
        self.task = None

    def __enter__(self) -> "LiveProgress":
        self.progress.start()
        self.task = self.progress.add_task(self.label, total=None, threads="-", files="0")
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def __call__(self, summary, controller) -> None:
        t = controller.threads
        done = summary.files_transferred + summary.files_skipped
        self.progress.update(self.task, total=summary.bytes_to_send or None, completed=summary.bytes,
                             threads=f"{t[0]}/{t[1]}/{t[2]}", files=f"{done}/{summary.files_total}")
