"""Live progress on a terminal (rich): bytes, rate, ETA and the current thread counts.

One line, fitted to the terminal's width (fields are dropped, least useful first, rather than
wrapped or cut), in the same binary units as the summary (MiB, MiB/s).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Deque, Optional, Tuple

from rich.console import Console
from rich.live import Live
from rich.text import Text

from automdt.units import format_bytes

RATE_WINDOW_S = 3.0


def _eta(seconds: Optional[float]) -> str:
    if seconds is None or seconds != seconds or seconds < 0 or seconds > 99 * 3600:
        return "ETA -:--"
    s = int(seconds + 0.5)
    return f"ETA {s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"ETA {s // 60}:{s % 60:02d}"


PRIORITY = ("amount", "rate", "threads", "files", "eta", "pct", "label")
"""Fields of the progress line, most useful first; the last ones go first when space is short."""
ORDER = ("label", "pct", "bar", "amount", "rate", "eta", "threads", "files")
"""Their order on the line."""


def progress_line(label: str, done: int, total: Optional[int], rate: float, threads: Tuple[int, int, int],
                  files: str, width: int) -> str:
    """The progress line for a terminal ``width`` columns wide (never longer than ``width``): the
    fields of :data:`PRIORITY` that fit, and a bar in what is left (if at least 10 columns)."""
    fields = {
        "amount": f"{format_bytes(done)}/{format_bytes(total)}" if total else format_bytes(done),
        "rate": f"{format_bytes(rate)}/s",
        "threads": "r/n/w " + "/".join(str(int(n)) for n in threads),
        "files": f"files {files}",
        "eta": _eta((total - done) / rate if rate > 0 else None) if total else "",
        "pct": f"{100.0 * min(done, total) / total:.0f}%" if total else "",
        "label": label,
    }
    keep = [k for k in PRIORITY if fields[k]]
    while keep and len("  ".join(fields[k] for k in keep)) > width:
        keep.pop()
    room = width - len("  ".join(fields[k] for k in keep)) - 2
    if total and room >= 10:
        n = min(room, 40)
        fill = int(n * min(1.0, done / total))
        fields["bar"] = "#" * fill + "-" * (n - fill)
        keep.append("bar")
    return "  ".join(fields[k] for k in ORDER if k in keep)[:width]


class LiveProgress:
    """A context manager whose instance is the ``progress`` callback of a transfer."""

    def __init__(self, label: str = "transfer", console: Optional[Console] = None):
        self.console = console or Console(stderr=False)
        self.label = label
        self.live = Live(Text(""), console=self.console, refresh_per_second=4, transient=False)
        self.samples: Deque[Tuple[float, int]] = deque()
        self.state = (0, None, (0, 0, 0), "0/0")

    def __enter__(self) -> "LiveProgress":
        self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        self.live.update(self._render(final=True), refresh=True)
        self.live.stop()

    def _rate(self, final: bool = False) -> float:
        s = self.samples
        if len(s) < 2:
            return 0.0
        (t0, b0), (t1, b1) = s[0], s[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def _render(self, final: bool = False) -> Text:
        done, total, threads, files = self.state
        width = max(20, self.console.width - 1)
        return Text(progress_line(self.label, done, total, self._rate(final), threads, files, width),
                    no_wrap=True, overflow="crop")

    def __call__(self, summary, controller) -> None:
        now = time.monotonic()
        self.samples.append((now, summary.bytes))
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()
        done_files = summary.files_transferred + summary.files_skipped
        self.state = (summary.bytes, summary.bytes_to_send or None, tuple(controller.threads),
                      f"{done_files}/{summary.files_total}")
        self.live.update(self._render())
