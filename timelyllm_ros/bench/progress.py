"""A one-line progress bar per replay, drawn with tqdm.

On a terminal the line is redrawn in place, at most every `min_interval_s`. Anywhere else (a log
file, a pipe) only the final line of each run is written, so logs stay short: tqdm itself would
write every redraw there.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

# The clock is the replay's (virtual on the simulated engine), the wall time is since the bar
# was made, so that it includes building the engine.
BAR_FORMAT = ("{desc:<22} [{bar:30}] {n}/{total} tasks  clock {clock_s:7.1f} s  "
              "wall {elapsed_s:6.1f} s")
BAR_CHARS = ".#"  # empty, filled
# Where the terminal reports no size (a pseudo-terminal may say 0 x 0, which tqdm takes as "no
# bar" and "no row to draw on"): large enough never to cut or hide the line.
_UNKNOWN_SIZE = 10_000


def _terminal_size(stream: TextIO) -> tuple[int, int]:
    """(columns, rows) of the terminal, so that tqdm cuts a line at its width rather than let it
    wrap (a wrapped line is not redrawn in place)."""
    try:
        size = os.get_terminal_size(stream.fileno())
        columns, rows = size.columns, size.lines
    except (AttributeError, OSError, ValueError):
        columns = rows = 0
    return (columns if columns > 0 else _UNKNOWN_SIZE, rows if rows > 0 else _UNKNOWN_SIZE)


class _ClockBar(tqdm):
    """tqdm with the replay's clock as a field of its line (`{clock_s}`)."""

    # No monitor thread: a replay's bar is updated from the replay loop only.
    monitor_interval = 0
    clock_s = 0.0

    @property
    def format_dict(self) -> dict[str, Any]:
        return {**super().format_dict, "clock_s": self.clock_s}


class ReplayProgress:
    """`progress(done, total, clock_s)` for `bench.replay.run_policy` and the ROS replay: tasks
    ended so far, tasks in all, seconds on the replay's clock. The run is over when
    done >= total; later calls draw nothing."""

    def __init__(self, label: str, stream: TextIO | None = None, min_interval_s: float = 0.1,
                 enabled: bool = True):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval_s = min_interval_s
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", None)  # a TextIO stand-in may not have one
        self.tty = bool(isatty()) if callable(isatty) else False
        self._created = time.time()  # tqdm's clock
        self._bar: _ClockBar | None = None
        self._over = False

    def __call__(self, done: int, total: int, clock_s: float) -> None:
        if not self.enabled or self._over:
            return
        final = done >= total
        if self.tty:
            self._redraw(done, total, clock_s, final)
        elif final:
            self.stream.write(self.render(done, total, clock_s) + "\n")
            self.stream.flush()
        self._over = final

    def render(self, done: int, total: int, clock_s: float) -> str:
        return tqdm.format_meter(done, total, time.time() - self._created, prefix=self.label,
                                 bar_format=BAR_FORMAT, ascii=BAR_CHARS, clock_s=clock_s)

    def _redraw(self, done: int, total: int, clock_s: float, final: bool) -> None:
        bar = self._bar
        if bar is None:
            columns, rows = _terminal_size(self.stream)
            # delay > 0: tqdm draws nothing before the first call has set the count and clock.
            bar = self._bar = _ClockBar(total=total, desc=self.label, file=self.stream,
                                        bar_format=BAR_FORMAT, ascii=BAR_CHARS, leave=True,
                                        ncols=columns, nrows=rows,
                                        mininterval=self.min_interval_s, miniters=0,
                                        delay=1e-9)
            bar.start_t = self._created
            bar.n, bar.clock_s = done, clock_s
            bar.refresh()
        else:
            bar.clock_s = clock_s
            bar.update(done - bar.n)  # draws when min_interval_s has passed since the last draw
        if final:
            bar.close()  # the final line, then a newline
