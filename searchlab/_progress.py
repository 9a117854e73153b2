"""A search's progress in a notebook: one display, updated in place, instead of a stream of lines.

``searchlab.run`` and ``searchlab.resume`` send their progress through ``echo``: one line per
trial event, a table every few seconds, notes and the final summary. In a terminal each is
printed. In a Jupyter kernel, :class:`NotebookProgress` keeps one output instead: the notes,
the latest table and the last few events, redrawn on every message.

Ray Tune, started in a notebook, clears the cell's output once (its own notebook reporter
calls ``clear_output``), which would also take a display made before it. So the display
that the notes before the search made is replaced by a new one when the search's first
event or table arrives: whether or not Tune cleared the first, one display remains.
"""

from __future__ import annotations

import collections
import html
import re
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["NotebookProgress", "default_echo", "in_notebook"]

_EVENT = re.compile(r"^\d\d:\d\d:\d\d trial ")
_TABLE_START = "-- "


def in_notebook() -> bool:
    """Whether this code runs in a Jupyter kernel (not a terminal IPython or plain Python)."""
    ipython = sys.modules.get("IPython")  # never imported here: a kernel has imported it
    get_shell = getattr(ipython, "get_ipython", None)
    shell = get_shell() if callable(get_shell) else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def default_echo() -> Callable[[str], None]:
    """Where progress goes by default: one updating display in a notebook, else ``print``."""
    return NotebookProgress() if in_notebook() else print


class NotebookProgress:
    """An ``echo`` for ``searchlab.run`` that keeps one notebook output up to date.

    The output shows the notes (where results go, the summary, how to resume), the latest
    progress table and the last ``recent`` trial events, and is replaced on every message.

    Example:
        >>> progress = NotebookProgress(recent=5)
        >>> results = searchlab.run("mnist/adaptive.yaml", echo=progress)
        >>> progress.lines_seen  # every message, also those no longer shown
    """

    def __init__(self, recent: int = 8) -> None:
        if recent < 0:
            raise ValueError(f"The value of `recent` is {recent}, but must be `recent >= 0`")
        self._head: list[str] = []  # notes before the search's first event or table
        self._tail: list[str] = []  # notes after it (the summary, resume hints)
        self._table = ""
        self._events: collections.deque[str] = collections.deque(maxlen=recent)
        self._events_seen = 0
        self._started = time.monotonic()
        self._handle: Any = None
        self.lines_seen = 0

    def __call__(self, text: str) -> None:
        self.lines_seen += 1
        if self._handle is not None and not (self._table or self._events_seen):
            if text.startswith(_TABLE_START) or _EVENT.match(text):
                self._handle.update({"text/plain": ""}, raw=True)  # a no-op once cleared
                self._handle = None
        if text.startswith(_TABLE_START):
            self._table = text
        elif _EVENT.match(text):
            self._events.append(text)
            self._events_seen += 1
        elif self._table or self._events_seen:
            self._tail.append(text)
        else:
            self._head.append(text)
        self._draw()

    def text(self) -> str:
        """What the display shows now, as plain text."""
        parts = list(self._head)
        if self._table:
            parts.append(self._table)
        if self._events:
            hidden = self._events_seen - len(self._events)
            more = f" (and {hidden} earlier)" if hidden else ""
            parts.append(f"latest trial events{more}:")
            parts += [f"  {event}" for event in self._events]
        parts += self._tail
        elapsed = time.monotonic() - self._started
        parts.append(f"elapsed {int(elapsed // 60)}m{int(elapsed % 60):02d}s")
        return "\n".join(parts)

    def _draw(self) -> None:
        from IPython.display import display

        text = self.text()
        bundle = {
            "text/plain": text,
            "text/html": f'<pre style="margin:0;line-height:1.3">{html.escape(text)}</pre>',
        }
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
