"""The compact progress table printed while an experiment runs."""

from __future__ import annotations

from typing import Any

from searchlab.experiment._spec import ExperimentSpec

__all__ = ["format_progress"]

_ORDER = ["RUNNING", "PAUSED", "PENDING", "COMPLETED", "ERRORED", "INVALID_HP"]


def format_progress(
    records: list[dict[str, Any]], spec: ExperimentSpec, rungs: list[dict[str, Any]] | None = None
) -> str:
    """Counts per state, then one row per running/paused trial and the best finished ones."""
    counts = {s: sum(r["state"] == s for r in records) for s in _ORDER}
    head = " | ".join(f"{s.lower()} {n}" for s, n in counts.items() if n)
    lines = [f"-- {spec.name}: {len(records)} trials: {head}"]
    sign = 1 if spec.smaller_is_better else -1

    def key(r: dict[str, Any]) -> float:
        return sign * r["best_metric"] if r["best_metric"] is not None else float("inf")

    shown = [r for r in records if r["state"] in ("RUNNING", "PAUSED")]
    shown += sorted((r for r in records if r["state"] == "COMPLETED"), key=key)[:5]
    if shown:
        lines.append(f"   {'trial':<14}{'state':<11}{'batches':>8}{'rung':>6}  best {spec.metric}")
        for r in shown:
            best = f"{r['best_metric']:.6g}" if r["best_metric"] is not None else "-"
            rung = "-" if r.get("rung") is None else str(r["rung"])
            lines.append(
                f"   {r['trial_id']:<14}{r['state']:<11}{r['batches']:>8}{rung:>6}  {best}"
            )
    for bracket in rungs or []:
        occupancy = ", ".join(
            f"{rung['rung_end']}: {rung['results']} done/{rung['promoted']} promoted"
            for rung in bracket.get("rungs", [])
        )
        lines.append(f"   bracket {bracket.get('bracket')}: {occupancy}")
    return "\n".join(lines)
