"""Helpers the benchmark scripts share: the machine, a table, the JSON result, ``--quick``.

    from _common import add_common_args, machine_info, print_table, result_path, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)                      # --quick (alias --smoke) and --out
    args = parser.parse_args()
    print_table(rows, ["size", "seconds"])
    write_result(result_path("my_bench", args), summary={"seconds": 1.2}, rows=rows)

A result file is ``{"summary": {...}, <sections>..., "machine": {...}}``. ``--quick`` runs tiny
sizes anywhere (CPU) and writes under ``$TMPDIR/searchlab-bench-smoke/``, never over the real
results in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import searchlab
from searchlab._bytecode import uncached_bytecode_hint

__all__ = [
    "RESULTS_DIR",
    "add_common_args",
    "machine_info",
    "print_table",
    "result_path",
    "run_search",
    "torchrun_json",
    "write_result",
]

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"
QUICK_DIR = pathlib.Path(tempfile.gettempdir()) / "searchlab-bench-smoke"


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """``--quick`` (also ``--smoke``): tiny sizes; ``--out``: where the JSON goes."""
    parser.add_argument(
        "--quick",
        "--smoke",
        dest="quick",
        action="store_true",
        help=f"tiny sizes on any machine; the result goes to {QUICK_DIR}",
    )
    parser.add_argument("--out", type=pathlib.Path, default=None, help="the JSON file to write")


def result_path(name: str, args: argparse.Namespace) -> pathlib.Path:
    """``--out``, else ``benchmarks/results/<name>.json`` (``--quick``: the temp directory)."""
    if getattr(args, "out", None):
        return pathlib.Path(args.out)
    return (QUICK_DIR if getattr(args, "quick", False) else RESULTS_DIR) / f"{name}.json"


def machine_info(packages: Iterable[str] = ("torch", "ray", "pandas", "pyarrow")) -> dict[str, Any]:
    """CPU model and count, memory, GPUs (``nvidia-smi``), Python, OS and package versions."""
    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpus": _gpus(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        # Not None: every new worker compiles torch from source, seconds of each start.
        "torch_bytecode_note": uncached_bytecode_hint(),
    }
    for name in packages:
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = None
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> None:
    """Rows as an aligned text table; floats with 4 significant digits."""
    columns = list(columns or (rows[0].keys() if rows else []))
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def write_result(path: pathlib.Path, summary: Mapping[str, Any], **sections: Any) -> pathlib.Path:
    """Write ``{"summary": ..., **sections, "machine": machine_info()}`` and say where."""
    data = {"summary": dict(summary), **sections}
    data.setdefault("machine", machine_info())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"wrote {path}")
    return path


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block; restore (or remove) them after it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_search(
    config: Mapping[str, Any],
    *,
    model_dir: pathlib.Path,
    storage_path: pathlib.Path,
    name: str,
    trials: int,
    verbose: bool = False,
) -> tuple[Any, float]:
    """``searchlab.run`` quietly (its output shown with ``verbose``), with its wall seconds.

    Where it raises, or ends with other than ``trials`` completed trials, the last 40 lines
    of its output are printed and the benchmark stops: a figure from a failed search would
    be wrong.
    """
    lines: list[str] = []
    began = time.time()
    try:
        results = searchlab.run(
            dict(config),
            model_dir=model_dir,
            storage_path=storage_path,
            name=name,
            echo=print if verbose else lines.append,
        )
    except Exception:
        print("\n".join(lines[-40:]))
        raise
    wall = time.time() - began
    states = results.trials["state"].tolist()
    if len(states) != trials or any(s != "COMPLETED" for s in states):
        print("\n".join(lines[-40:]))
        raise RuntimeError(f"{name}: expected {trials} completed trials, got states {states}")
    return results, wall


def torchrun_json(
    script: pathlib.Path,
    script_args: Sequence[str],
    *,
    gpus: int,
    out: pathlib.Path,
    env: Mapping[str, str],
    cwd: pathlib.Path,
    verbose: bool,
    timeout: float,
) -> dict[str, Any]:
    """``python -m torch.distributed.run --standalone --nproc_per_node=gpus script
    *script_args``, whose rank 0 writes a JSON file ``out``: that file's content, with
    ``launch_wall_s`` (from the launch to the exit). On a failed run, print its last 60 lines
    of output (``verbose`` shows them as they come instead) and raise. ``OMP_NUM_THREADS``
    defaults to 1, torchrun's own default for several processes a node, stated so that it
    prints no warning; the rest of ``env`` (NCCL settings included) reaches every rank."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={gpus}",
        str(script),
        *script_args,
    ]
    began = time.time()
    proc = subprocess.run(
        cmd,
        env={"OMP_NUM_THREADS": "1", **env},
        cwd=cwd,
        capture_output=not verbose,
        text=True,
        timeout=timeout,
        check=False,
    )
    wall = time.time() - began
    if proc.returncode != 0 or not out.is_file():
        if proc.stdout or proc.stderr:
            print("\n".join(((proc.stdout or "") + (proc.stderr or "")).splitlines()[-60:]))
        raise RuntimeError(f"torchrun exited with {proc.returncode}: {' '.join(cmd)}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["launch_wall_s"] = wall
    return result
