"""Measurements of ``scale.py``: GPU sampling with nvidia-smi, and per-GPU busy intervals.

``GpuSampler`` runs ``nvidia-smi --query-gpu=timestamp,index,uuid,utilization.gpu,memory.used
--format=csv,noheader,nounits -lms 200`` in a subprocess and keeps every line as a sample
(``t``, ``index``, ``util``, ``mem_mib``). The rest are pure functions over the trials' event
lines (``scale_model/scale_def.py``), the driver's trial state lines and those samples.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import itertools
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

__all__ = [
    "GpuSampler",
    "Segment",
    "analyse",
    "gpu_state",
    "measure_cuda_context",
    "parse_trial_line",
    "physical_gpus",
    "query_gpus",
    "read_events",
    "segments_from_events",
]

SMI_FIELDS = "timestamp,index,uuid,utilization.gpu,memory.used"
_TRIAL_LINE = re.compile(r"\btrial (\S+) (started|resumed|paused|finished|errored)\b")


def _smi() -> str | None:
    return shutil.which("nvidia-smi")


def query_gpus() -> list[dict[str, Any]] | None:
    """Every GPU nvidia-smi lists (index, uuid, name, memory), or None without nvidia-smi."""
    smi = _smi()
    if smi is None:
        return None
    query = "--query-gpu=index,uuid,name,memory.total"
    try:
        out = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        index, uuid, name, total = parts[0], parts[1], ", ".join(parts[2:-1]), parts[-1]
        gpus.append(
            {"index": int(index), "uuid": uuid, "name": name, "memory_total_mib": _num(total)}
        )
    return gpus


_CONTEXT_PROBE = """
import gc, sys, torch
torch.backends.cudnn.benchmark = True
conv = torch.nn.Conv2d(3, 64, 3, padding=1).cuda().to(memory_format=torch.channels_last)
head = torch.nn.Linear(64, 10).cuda()
x = torch.randn(256, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = head(conv(x).mean((2, 3))).float().sum()
loss.backward()
del conv, head, x, loss
gc.collect()
torch.cuda.synchronize()
torch._C._cuda_clearCublasWorkspaces()
torch.cuda.empty_cache()
print("ready", torch.cuda.memory_reserved(), flush=True)
sys.stdin.read()
"""


def measure_cuda_context(index: int) -> float | None:
    """GPU memory (MiB, nvidia-smi) of an idle process that has trained on the GPU: torch's
    CUDA context with cuDNN and cuBLAS loaded, after it gave its cached blocks back, as a
    trial's actor does when its trial pauses. None without nvidia-smi or CUDA."""

    def used() -> float | None:
        smi = _smi()
        if smi is None:
            return None
        out = subprocess.run(
            [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", f"-i={index}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
        return _num(out) if out else None

    before = used()
    if before is None:
        return None
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CONTEXT_PROBE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith("ready"):
            return None
        time.sleep(1.0)
        during = used()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=60)
    return None if during is None else during - before


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]"


def _norm_uuid(uuid: str | None) -> str | None:
    if not uuid:
        return None
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


class GpuSampler:
    """``nvidia-smi -lms`` in a background process; ``samples`` grows while it runs.

    Each line carries nvidia-smi's own timestamp (local time, ms), so pipe buffering cannot
    shift the samples in time; the receipt time is kept to check the clock.
    """

    def __init__(
        self, indices: Iterable[int], period_ms: int = 200, extra: Iterable[str] = ()
    ) -> None:
        self.indices = set(indices)
        self.period_ms = period_ms
        # More nvidia-smi fields (``clocks.sm``, ``temperature.gpu``, ...): each sample keeps
        # them under the name with "." as "_", as numbers (None for "[N/A]").
        self.extra = tuple(extra)
        self.samples: list[dict[str, Any]] = []
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._offsets: list[float] = []

    def start(self) -> bool:
        smi = _smi()
        if smi is None:
            return False
        cmd = [
            smi,
            "--query-gpu=" + ",".join((SMI_FIELDS, *self.extra)),
            "--format=csv,noheader,nounits",
            "-lms",
            str(self.period_ms),
        ]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
        )
        self._thread = threading.Thread(target=self._read, name="gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            received = time.time()
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 5 + len(self.extra) or not parts[1].isdigit():
                continue
            stamp = _parse_stamp(parts[0])
            if stamp is not None:
                self._offsets.append(received - stamp)
            index = int(parts[1])
            if index not in self.indices:
                continue
            self.samples.append(
                {
                    "t": stamp if stamp is not None else received,
                    "received": received,
                    "index": index,
                    "util": _num(parts[3]),
                    "mem_mib": _num(parts[4]),
                    **{
                        name.replace(".", "_"): _num(value)
                        for name, value in zip(self.extra, parts[5:])
                    },
                }
            )

    def latest(self) -> dict[int, dict[str, Any]]:
        """The newest sample of each GPU."""
        out: dict[int, dict[str, Any]] = {}
        for s in reversed(self.samples[-8 * max(len(self.indices), 1) :]):
            out.setdefault(s["index"], s)
        return out

    def stop(self) -> list[dict[str, Any]]:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._fix_clock()
        return self.samples

    def _fix_clock(self) -> None:
        """nvidia-smi prints local time; if its zone is not Python's, shift by whole zones."""
        if not self._offsets:
            return
        offset = statistics.median(self._offsets)
        if abs(offset) < 300:
            return
        shift = round(offset / 900) * 900
        for s in self.samples:
            s["t"] += shift


def _parse_stamp(text: str) -> float | None:
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    return None


def parse_trial_line(t: float, line: str) -> dict[str, Any] | None:
    """A driver line "HH:MM:SS trial <id> paused at batch N ..." as {t, trial_id, state}."""
    found = _TRIAL_LINE.search(line)
    if not found:
        return None
    return {"t": t, "trial_id": found.group(1), "state": found.group(2)}


def read_events(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a killed worker
    return events


@dataclasses.dataclass
class Segment:
    """One run of a trial in a worker: from its build to its last work (validation/checkpoint)."""

    trial_id: str
    gpu: str
    start: float
    end: float
    first_batch: float | None
    resumed: bool
    pid: int
    batches: int | None
    worked: bool  # False: built in a worker that Tune then dropped (the trial ran elsewhere)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def gpu_key(event: dict[str, Any], by_uuid: dict[str, int]) -> str:
    """The nvidia-smi index of the event's GPU (by UUID), else the one GPU id Ray put in its
    CUDA_VISIBLE_DEVICES, else (on CPU) ``cpu:<pid>``: each worker process stands for a GPU."""
    uuid = _norm_uuid(event.get("gpu_uuid"))
    if uuid and uuid in by_uuid:
        return str(by_uuid[uuid])
    visible = str(event.get("visible") or "")
    if visible.isdigit():  # Ray gave the worker this one GPU (an nvidia-smi index here)
        return visible
    return f"cpu:{event.get('pid')}"


def segments_from_events(
    events: list[dict[str, Any]], gpus: list[dict[str, Any]] | None
) -> list[Segment]:
    by_uuid = {u: g["index"] for g in gpus or [] if (u := _norm_uuid(g["uuid"]))}
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for e in events:
        runs.setdefault((e["trial_id"], e["build_t"]), []).append(e)
    segments = []
    for (trial_id, build_t), evs in runs.items():
        work = [e for e in evs if e["event"] not in ("shutdown", "build")]
        first = [e["t"] for e in evs if e["event"] == "first_batch"]
        startup = [e for e in evs if e["event"] == "startup"]
        reports = [e.get("batches") for e in evs if e["event"] == "report"]
        segments.append(
            Segment(
                trial_id=trial_id,
                gpu=gpu_key(evs[0], by_uuid),
                start=build_t,
                end=max([build_t, *(e["t"] for e in work)]),
                first_batch=min(first) if first else None,
                resumed=bool(startup and startup[0].get("resumed")),
                pid=int(evs[0].get("pid", -1)),
                batches=max((b for b in reports if b is not None), default=None),
                worked=bool(work),
            )
        )
    return sorted(segments, key=lambda s: s.start)


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _covered(merged: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merged)


def _inside(merged: list[tuple[float, float]], starts: list[float], t: float) -> bool:
    i = bisect.bisect_right(starts, t) - 1
    return i >= 0 and t <= merged[i][1]


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p90": None, "max": None, "count": 0}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "median": statistics.median(ordered),
        "p90": p90,
        "max": ordered[-1],
        "count": len(ordered),
    }


def handover_gaps(segments: list[Segment]) -> list[dict[str, Any]]:
    """For each GPU, each time one trial left it and the next one was built on it."""
    gaps = []
    by_gpu: dict[str, list[Segment]] = {}
    for s in segments:
        by_gpu.setdefault(s.gpu, []).append(s)
    for gpu, segs in by_gpu.items():
        segs.sort(key=lambda s: s.start)
        for prev, nxt in itertools.pairwise(segs):
            gaps.append(
                {
                    "gpu": gpu,
                    "t": prev.end,
                    "gap_s": nxt.start - prev.end,
                    "to_first_batch_s": (
                        nxt.first_batch - prev.end if nxt.first_batch is not None else None
                    ),
                    "left": prev.trial_id,
                    "next": nxt.trial_id,
                    "next_resumed": nxt.resumed,
                }
            )
    return sorted(gaps, key=lambda g: g["t"])


def paused_counts(states: list[dict[str, Any]]) -> tuple[list[float], list[int]]:
    """Times at which the number of PAUSED trials changes, and the number from then on."""
    current: dict[str, str] = {}
    times, counts = [], []
    for e in sorted(states, key=lambda e: e["t"]):
        current[e["trial_id"]] = e["state"]
        times.append(e["t"])
        counts.append(sum(1 for s in current.values() if s == "paused"))
    return times, counts


def _paused_at(times: list[float], counts: list[int], t: float) -> int:
    i = bisect.bisect_right(times, t) - 1
    return counts[i] if i >= 0 else 0


def analyse(
    segments: list[Segment],
    states: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    gpu_keys: list[str],
    settle_s: float = 3.0,
) -> dict[str, Any]:
    """Per-GPU busy fractions, hand-over gaps and the memory of GPUs with no running trial.

    ``settle_s``: memory samples of a GPU idle at least that long (its last trial's actor had
    time to give memory back) are also kept apart, as ``..._settled_mib``.
    """
    dropped = [s for s in segments if not s.worked]
    segments = [s for s in segments if s.worked]
    if not segments:
        raise RuntimeError("no trial events were logged: did any trial run?")
    lo, hi = min(s.start for s in segments), max(s.end for s in segments)
    first_runs: dict[str, float] = {}
    for s in segments:
        first_runs[s.trial_id] = min(first_runs.get(s.trial_id, s.start), s.start)
    fill_end = max(first_runs.values())  # the last new trial began: work waited until then
    keys = gpu_keys or sorted({s.gpu for s in segments})
    merged = {k: _merge([(s.start, s.end) for s in segments if s.gpu == k]) for k in keys}
    gaps = handover_gaps(segments)
    times, counts = paused_counts(states)
    per_gpu = {}
    idle_paused: list[float] = []
    settled: dict[str, list[float]] = {}
    for k in keys:
        segs = [s for s in segments if s.gpu == k]
        own_gaps = [g for g in gaps if g["gpu"] == k]
        row: dict[str, Any] = {
            "runs": len(segs),
            "builds_without_training": sum(s.gpu == k for s in dropped),
            "first_run_at_s": min(s.start for s in segs) - lo if segs else None,
            "resumes": sum(s.resumed for s in segs),
            "busy_s": _covered(merged[k], lo, hi),
            "busy_fraction": _covered(merged[k], lo, hi) / (hi - lo) if hi > lo else None,
            "busy_fraction_until_last_new_trial": (
                _covered(merged[k], lo, fill_end) / (fill_end - lo) if fill_end > lo else None
            ),
            "gap_s": _quantiles([g["gap_s"] for g in own_gaps]),
            "gap_to_first_batch_s": _quantiles(
                [g["to_first_batch_s"] for g in own_gaps if g["to_first_batch_s"] is not None]
            ),
        }
        row.update(_available_work(merged[k], lo, hi, fill_end))
        stats, idle = _sample_stats(k, samples, merged[k], lo, hi, times, counts, settle_s)
        row.update(stats)
        idle_paused.extend(m for m, _ in idle)
        settled[k] = [m for m, idle_s in idle if idle_s >= settle_s]
        row["memory_idle_with_paused_trials_settled_mib"] = _quantiles(settled[k])
        per_gpu[k] = row
    return {
        "window": {
            "start": lo,
            "end": hi,
            "seconds": hi - lo,
            "last_new_trial_at_s": fill_end - lo,
        },
        "concurrency": _concurrency(segments, lo, hi),
        "builds_without_training": len(dropped),
        "per_gpu": per_gpu,
        "gaps": gaps,
        "gap_s": _quantiles([g["gap_s"] for g in gaps]),
        "gap_until_last_new_trial_s": _quantiles([g["gap_s"] for g in gaps if g["t"] <= fill_end]),
        "gap_to_first_batch_s": _quantiles(
            [g["to_first_batch_s"] for g in gaps if g["to_first_batch_s"] is not None]
        ),
        "paused_trial_memory_mib": _quantiles(idle_paused),
        "paused_trial_memory_settled_mib": _quantiles([m for v in settled.values() for m in v]),
        "settle_s": settle_s,
    }


def _available_work(
    merged: list[tuple[float, float]], lo: float, hi: float, fill_end: float
) -> dict[str, Any]:
    """A GPU's busy share of the time it had work to do.

    Until the last new trial began, new trials were always waiting: all of that time had
    work. After it, only the search's own promotions make work (ASHA's last rungs run fewer
    trials than there are GPUs), so the time with work is the GPU's runs plus the idle gaps
    that ended with another run on it (a hand-over). ``available_fraction`` is that time over
    the window: what the search itself allowed.
    """
    busy = _covered(merged, lo, hi)
    idle_before = (fill_end - lo) - _covered(merged, lo, fill_end)
    handovers_after = sum(
        max(0.0, b_lo - max(a_hi, fill_end))
        for (_, a_hi), (b_lo, _) in itertools.pairwise(merged)
        if b_lo > fill_end
    )
    available = busy + idle_before + handovers_after
    return {
        "available_s": available,
        "available_fraction": available / (hi - lo) if hi > lo else None,
        "busy_fraction_of_available": busy / available if available > 0 else None,
    }


def _concurrency(segments: list[Segment], lo: float, hi: float) -> dict[str, Any]:
    """How many trials ran at once: the most, the time-weighted mean, and when each count
    was first reached (seconds into the window)."""
    edges = sorted([(s.start, 1) for s in segments] + [(s.end, -1) for s in segments])
    running, most, reached = 0, 0, {}
    for t, step in edges:
        running += step
        if running > most:
            most = running
            reached[str(running)] = t - lo
    busy = sum(s.end - s.start for s in segments)
    return {"max": most, "mean": busy / (hi - lo) if hi > lo else None, "first_reached_s": reached}


def _sample_stats(
    key: str,
    samples: list[dict[str, Any]],
    merged: list[tuple[float, float]],
    lo: float,
    hi: float,
    times: list[float],
    counts: list[int],
    settle_s: float,
) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    """nvidia-smi figures of one GPU: util > 0 share, memory before, while busy, while idle
    with trials paused; and the memory samples of the last kind with how long the GPU had
    been idle then."""
    if not key.isdigit():
        return {"samples": 0}, []
    own = [s for s in samples if s["index"] == int(key)]
    starts = [a for a, _ in merged]
    window = [s for s in own if lo <= s["t"] <= hi]
    before = [s["mem_mib"] for s in own if s["t"] < lo and s["mem_mib"] is not None]
    busy_mem, idle_paused = [], []
    for s in window:
        if s["mem_mib"] is None:
            continue
        if _inside(merged, starts, s["t"]):
            busy_mem.append(s["mem_mib"])
        elif _paused_at(times, counts, s["t"]) > 0:
            idle_paused.append((s["mem_mib"], _idle_for(merged, starts, s["t"], lo)))
    utils = [s["util"] for s in window if s["util"] is not None]
    stats = {
        "samples": len(window),
        "smi_busy_fraction": sum(u > 0 for u in utils) / len(utils) if utils else None,
        "smi_util_mean": statistics.fmean(utils) if utils else None,
        "memory_before_search_mib": statistics.median(before) if before else None,
        "memory_running_mib": _quantiles(busy_mem),
        "memory_idle_with_paused_trials_mib": _quantiles([m for m, _ in idle_paused]),
    }
    return stats, idle_paused


def _idle_for(merged: list[tuple[float, float]], starts: list[float], t: float, lo: float) -> float:
    """How long the GPU had been without a running trial at ``t`` (outside every interval)."""
    i = bisect.bisect_right(starts, t) - 1
    return t - (merged[i][1] if i >= 0 else lo)


def physical_gpus(gpus: int) -> list[int]:
    """nvidia-smi's indices of the GPUs both sides use: the first ``gpus`` that
    ``CUDA_VISIBLE_DEVICES`` names (when it names them by index), else 0..gpus-1."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if visible and all(v.isdigit() for v in visible):
        return [int(v) for v in visible[:gpus]]
    return list(range(gpus))


def gpu_state(samples: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any] | None:
    """nvidia-smi's view of the GPUs in [t0, t1] (unix s): medians of SM clock (MHz),
    utilisation (%) and power (W) over all samples of the GPUs in use, and the hottest
    temperature (C). None without samples (no nvidia-smi, --smoke)."""
    inside = [x for x in samples if t0 <= x["t"] <= t1]
    if not inside:
        return None

    def median(key: str) -> float | None:
        values = [x[key] for x in inside if x.get(key) is not None]
        return statistics.median(values) if values else None

    temps = [x["temperature_gpu"] for x in inside if x.get("temperature_gpu") is not None]
    return {
        "samples": len(inside),
        "sm_clock_mhz": median("clocks_sm"),
        "util_pct": median("util"),
        "power_w": median("power_draw"),
        "temperature_max_c": max(temps) if temps else None,
    }
