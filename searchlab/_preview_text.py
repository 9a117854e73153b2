"""The text form of ``searchlab preview``: the brackets of a search plan and where trials end."""

from __future__ import annotations

from typing import Any

__all__ = ["format_plan"]


def format_plan(plan: dict[str, Any]) -> str:
    """A readable table of a plan from :func:`searchers.preview_plan`.

    One row per bracket (rungs, trials, concurrency, rung ends in the config's unit), then how
    many trials train to each length.

    Example:
        >>> print(format_plan(preview_plan(load_experiment_config("adaptive.yaml"))))
        bracket  rungs  trials  concurrency  rung ends (batches)
              0      4      45            6  15, 62, 250, 1000
        ...
    """
    unit = plan["unit"]
    brackets = plan["brackets"]
    bracket_rows = [
        [
            str(i),
            str(b["rungs"]),
            str(b["trials"]),
            str(b["concurrency"]),
            ", ".join(str(end) for end in b["rung_ends"]),
        ]
        for i, b in enumerate(brackets)
    ]
    total = sum(int(b["trials"]) for b in brackets)
    bracket_rows.append(["all", "", str(total), "", ""])
    header = ["bracket", "rungs", "trials", "concurrency", f"rung ends ({unit})"]
    lines = _table(header, bracket_rows, left_last=True)
    lines += ["", "trials that train to each length:"]
    length_rows = [[str(length), str(n)] for length, n in plan["trials_per_length"].items()]
    lines += ["  " + line for line in _table([f"length ({unit})", "trials"], length_rows)]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]], *, left_last: bool = False) -> list[str]:
    """Right-aligned columns; with ``left_last`` the last one (a free-form list) is left-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    if left_last:
        widths[-1] = 0

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths)).rstrip()

    return [line(header), *(line(row) for row in rows)]
