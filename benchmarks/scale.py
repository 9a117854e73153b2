"""Scale run: how busy an adaptive ASHA search keeps every GPU, and a trial on all of them vs DDP.

    PYTHONPATH=. python benchmarks/scale.py [--part search|ddp|all] [--gpus N]
    PYTHONPATH=. python benchmarks/scale.py --smoke   # CPU, tiny sizes, results in the temp dir

Runs unchanged on any number of GPUs (default: all visible; ``--gpus N`` takes the first N).

1. **search**: a real ``searchlab.run`` of an ``adaptive_asha`` search (``--trials`` 64,
   ``--max-length`` 4096 batches of 256, ``mode: aggressive``, ``divisor: 4``: rungs at 64,
   256, 1024 and 4096 batches) of ResNet-18 on synthetic CIFAR-shaped data, with
   ``resources.slots_per_trial: 1`` and ``max_concurrent_trials`` = the GPU count, so one
   trial per GPU at a time. The trial is ``scale_model/scale_def.py:ScaleResNetTrial``
   (``resnet_model``'s trial, which also logs when and on which GPU it ran: see that file).
   Measured:

   - From the trials' event lines, each run of a trial on a GPU (a start or a resume) is an
     interval from its build to its last work (the validation or checkpoint that ends it).
     ``busy_fraction`` of a GPU is the share of the window (first trial build to last trial
     end) covered by its intervals. ASHA ends with fewer trials than GPUs (one trial trains
     the last rung alone), so ``busy_fraction_until_last_new_trial`` is kept beside it: the
     same share up to the moment the last new trial was built, while work was always waiting.
     ``available_fraction``: the share of the window the GPU had work (until the last new
     trial began, all of it; after, its runs and the idle gaps that ended with a promoted
     trial's run on it), and ``busy_fraction_of_available`` its busy share of that time: how
     well searchlab used what the search allowed.
   - ``median_gap_s``: over all hand-overs, the time from one trial's last work on a GPU to
     the next trial's build on it (``gap_to_first_batch_s``: to its first batch).
   - nvidia-smi (``-lms`` ``--sample-ms`` 200) samples every GPU's utilisation and memory:
     ``smi_busy_fraction`` is the share of samples in the window with utilisation > 0;
     ``idle_gpu_memory_with_paused_trials_mib`` the memory.used of GPUs that no trial runs on
     while some trial is PAUSED (per the driver's trial lines), and ``..._settled`` the same
     for GPUs idle at least 3 s (a paused trial's actor gives its memory back after 1 s idle:
     ``SEARCHLAB_RELEASE_IDLE_AFTER_S``). Before the search, a probe process trains a conv
     layer on GPU 0, gives its cached blocks back and idles: ``cuda_context_mib`` is what
     nvidia-smi shows for it (the CUDA context with cuDNN and cuBLAS, which an idle worker
     keeps to take its next trial without a new process). ``paused_trial_memory_mib``: the
     worst GPU's settled median beyond that context.

2. **ddp**: ``data_parallel.py --gpus N --seconds 30`` in a subprocess: one searchlab trial
   with ``slots_per_trial`` = N against ``torchrun`` DDP of the same loop (needs N >= 2).

The search is interrupted (as Ctrl-C does: every trial pauses at a checkpoint) after
``--search-timeout`` seconds (default 200 on 4 or more GPUs, so that a whole run stays under
6 minutes there; 330 on 2-3 GPUs; 480 on one); the figures then cover what ran, and the result
says so. ``--max-pending-trials N`` sets Tune's ``TUNE_MAX_PENDING_TRIALS_PG`` for the search
(Tune's default for a custom searcher is 1 pending trial), to compare against the default.

Prints a table and writes ``benchmarks/results/scale_<N>gpu.json`` (``--smoke``: the temp
directory, never ``benchmarks/results``). With ``--part search`` or ``ddp`` alone, the other
part is kept from that file if it was measured on the same GPUs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from _cifar import ensure_fake_cifar
from _scale_measure import (
    GpuSampler,
    analyse,
    measure_cuda_context,
    parse_trial_line,
    query_gpus,
    read_events,
    segments_from_events,
)
from _scale_report import keep_previous, print_table, summarise, table

import searchlab

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIR = HERE / "scale_model"
RESULTS = HERE / "results"
BATCHES_PER_S = 110  # one ResNet-18 trial at 256/batch on an H100/H200 (gpu_packing.json)
SETUP_S = 3.0  # rough cost of each trial start or resume (build, loader, checkpoint)


def select_gpus(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The GPUs the run uses (nvidia-smi's rows); narrows CUDA_VISIBLE_DEVICES to them."""
    if args.smoke:
        return []
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as nvidia-smi
    listed = query_gpus()
    if listed is None:
        import torch

        listed = [
            {"index": i, "uuid": None, "name": None, "memory_total_mib": None}
            for i in range(torch.cuda.device_count())
        ]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        listed = [
            next(g for g in listed if v in (str(g["index"]), g["uuid"]))
            for v in wanted
            if any(v in (str(g["index"]), g["uuid"]) for g in listed)
        ]
    if not listed:
        raise SystemExit("scale.py: no GPU found; use --smoke to check the script on CPU")
    if args.gpus > len(listed):
        raise SystemExit(f"--gpus {args.gpus}, but only {len(listed)} GPU(s) are visible")
    gpus = listed[: args.gpus or len(listed)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g["index"]) for g in gpus)
    return gpus


def search_config(
    args: argparse.Namespace, root: pathlib.Path, event_log: pathlib.Path
) -> dict[str, Any]:
    return {
        "name": "scale",
        "entrypoint": "scale_def:ScaleResNetTrial",
        "hyperparameters": {
            "global_batch_size": args.batch_size,
            "num_workers": args.num_workers,
            "lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1},
            "weight_decay": {"type": "log", "base": 10, "minval": -5, "maxval": -3},
        },
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "max_trials": args.trials,
            "max_length": {"batches": args.max_length},
            "mode": args.mode,
            "divisor": args.divisor,
            "max_concurrent_trials": args.concurrency,
        },
        "resources": {"slots_per_trial": 1, "cpus_per_trial": args.cpus_per_trial},
        "scheduling_unit": args.report_every,
        "checkpoint_policy": "none",
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 0},
        "data": {
            "root": str(root),
            "n_train": args.n_train,
            "n_test": args.n_test,
            "epoch_images": args.max_length * args.batch_size,  # no loader restart in a trial
            "event_log": str(event_log),
        },
    }


def plan(args: argparse.Namespace, slots: int) -> dict[str, Any]:
    """The searcher's rungs and a rough time estimate (printed before the search)."""
    from searchers.adaptive import build_adaptive_plan

    p = build_adaptive_plan(
        args.max_length,
        args.trials,
        mode=args.mode,
        divisor=args.divisor,
        max_concurrent_trials=args.concurrency,
    )
    resumes = 0
    for bracket in p.brackets:  # promotion: int(reaching / divisor) go on from each rung
        reaching = bracket.num_trials
        for _ in bracket.rung_ends[1:]:
            reaching = int(reaching / args.divisor)
            resumes += reaching
    ends = max(p.brackets, key=lambda b: b.num_rungs).rung_ends
    tail = (ends[-1] - (ends[-2] if len(ends) > 1 else 0)) / BATCHES_PER_S  # last trial alone
    total = p.total_length()
    runs = args.trials + resumes
    estimate = 25 + (runs * SETUP_S + total / BATCHES_PER_S) / max(slots, 1) + tail
    return {
        "rung_ends": [b.rung_ends for b in p.brackets],
        "trials_per_length": {str(k): v for k, v in p.trials_per_length().items()},
        "total_batches": total,
        "planned_runs": runs,
        "estimate_s": estimate,
        "estimate_assumes": f"{BATCHES_PER_S} batches/s per GPU, {SETUP_S} s per trial start or "
        "resume, 25 s of Ray start-up, the last rung's extra length trained alone",
    }


class TrialLines:
    """searchlab's ``echo``: keeps the trial state lines with sub-second times, prints some.

    Plain data (Tune pickles the callbacks, and with them this), unlike ``Progress``.
    """

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.states: list[dict[str, Any]] = []

    def __call__(self, line: str) -> None:
        event = parse_trial_line(time.time(), line)
        if event is not None:
            self.states.append(event)
        if self.verbose or (event and event["state"] == "errored") or " starts: " in line:
            print(line, flush=True)


class Progress:
    """Prints a status line every ``every_s`` from the trial lines and the GPU samples."""

    def __init__(self, sampler: GpuSampler | None, every_s: float, verbose: bool) -> None:
        self.sampler, self.every_s = sampler, every_s
        self.echo = TrialLines(verbose)
        self.states = self.echo.states
        self.began = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def start(self) -> None:
        self.began = time.time()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            print(self.line(), flush=True)

    def line(self) -> str:
        last: dict[str, str] = {}
        for e in self.states:
            last[e["trial_id"]] = e["state"]
        count = {s: sum(v == s for v in last.values()) for s in ("paused", "finished")}
        running = sum(v in ("started", "resumed") for v in last.values())
        resumes = sum(e["state"] == "resumed" for e in self.states)
        text = (
            f"[{time.time() - self.began:5.0f} s] trials: {len(last)} started, {resumes} resumes;"
            f" {running} running, {count['paused']} paused, {count['finished']} finished"
        )
        if self.sampler is not None and self.sampler.samples:
            latest = sorted(self.sampler.latest().items())
            text += " | util % " + " ".join(
                f"{s['util']:.0f}" for _, s in latest if s["util"] is not None
            )
            text += " | mem GiB " + " ".join(
                f"{s['mem_mib'] / 1024:.1f}" for _, s in latest if s["mem_mib"] is not None
            )
        return text


class Watchdog:
    """After ``seconds``, Ctrl-C (searchlab pauses every trial and returns); 120 s later, again
    (searchlab quits at once). Keeps a default run inside the GPU machine's command limit."""

    def __init__(self, seconds: float) -> None:
        self.fired = 0
        self._timers = [
            threading.Timer(seconds, self._fire),
            threading.Timer(seconds + 120, self._fire),
        ]

    def _fire(self) -> None:
        self.fired += 1
        print(f"scale.py: search past its time limit: interrupt {self.fired}", flush=True)
        os.kill(os.getpid(), signal.SIGINT)

    def __enter__(self) -> Watchdog:
        for t in self._timers:
            t.daemon = True
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for t in self._timers:
            t.cancel()


def run_search(
    args: argparse.Namespace, gpus: list[dict[str, Any]], root: pathlib.Path, tmp: pathlib.Path
) -> dict[str, Any]:
    slots = len(gpus) or args.concurrency
    info = plan(args, slots)
    print(
        f"search: {args.trials} trials, rungs at {info['rung_ends']} batches, "
        f"{info['total_batches']} batches in all (~{info['planned_runs']} trial starts and "
        f"resumes) on {f'{len(gpus)} GPU(s)' if gpus else 'CPU'}, "
        f"{args.concurrency} at a time; "
        f"rough estimate {info['estimate_s'] / 60:.1f} min (cut off at "
        f"{args.search_timeout / 60:.1f} min)",
        flush=True,
    )
    event_log = tmp / "events.jsonl"
    context_mib = measure_cuda_context(gpus[0]["index"]) if gpus else None
    if context_mib is not None:
        print(f"an idle CUDA context (cuDNN, cuBLAS loaded) takes {context_mib:.0f} MiB here")
    if args.max_pending_trials:  # read by Tune's controller in this process
        os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(args.max_pending_trials)
    sampler = GpuSampler([g["index"] for g in gpus], args.sample_ms) if gpus else None
    sampling = sampler.start() if sampler else False
    progress = Progress(sampler if sampling else None, args.progress_every, args.verbose)
    progress.start()
    began, results, interrupted = time.time(), None, False
    try:
        with Watchdog(args.search_timeout) as watchdog:
            try:
                results = searchlab.run(
                    search_config(args, root, event_log),
                    model_dir=MODEL_DIR,
                    storage_path=tmp / "search",
                    name="scale",
                    echo=progress.echo,
                )
            except KeyboardInterrupt:
                if not watchdog.fired:
                    raise
            interrupted = watchdog.fired > 0
    finally:
        progress.stop()
        samples = sampler.stop() if sampling and sampler else []
    wall = time.time() - began
    print(progress.line(), flush=True)
    segments = segments_from_events(read_events(event_log), gpus)
    try:
        analysis = analyse(segments, progress.states, samples, [str(g["index"]) for g in gpus])
    except RuntimeError as exc:  # no trial ran: keep what there is, and the ddp part still runs
        print(f"search: {exc}", flush=True)
        analysis = {"error": str(exc)}
    states = results.trials["state"].value_counts().to_dict() if results is not None else None
    return {
        "plan": info,
        "search_wall_s": wall,
        "interrupted_by_time_limit": interrupted,
        "trial_states": states,
        "runs": len(segments),
        "resumes": sum(s.resumed for s in segments),
        "gpu_sampling": "nvidia-smi" if sampling else None,
        "nvidia_smi_samples": len(samples),
        "cuda_context_mib": context_mib,
        **analysis,
        "segments": [s.to_dict() for s in segments],
        "trial_lines": progress.states,
    }


def run_ddp(args: argparse.Namespace, n_gpus: int, tmp: pathlib.Path) -> dict[str, Any]:
    if not args.smoke and n_gpus < 2:
        return {"skipped": f"data_parallel.py needs >= 2 GPUs; this run has {n_gpus}"}
    out = tmp / "data_parallel.json"
    cmd = [sys.executable, str(HERE / "data_parallel.py"), f"--out={out}"]
    cmd += ["--smoke"] if args.smoke else [f"--gpus={n_gpus}", f"--seconds={args.ddp_seconds}"]
    if args.data_dir:
        cmd.append(f"--data-dir={args.data_dir}")
    print(f"ddp: {' '.join(cmd[1:])}", flush=True)
    began = time.time()
    try:
        proc = subprocess.run(cmd, cwd=HERE.parent, check=False, timeout=300 + 4 * args.ddp_seconds)
    except subprocess.TimeoutExpired:
        return {"error": "data_parallel.py did not finish in time"}
    if proc.returncode != 0 or not out.is_file():
        return {"error": f"data_parallel.py exited with {proc.returncode}"}
    result = json.loads(out.read_text())
    result["wall_s"] = time.time() - began
    return result


def machine(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Called last: torch.cuda here would put a CUDA context on a GPU the search measures."""
    import ray
    from trainer_parity import machine_info

    info = {**machine_info(), "ray": ray.__version__}
    info["gpu_names"] = [g["name"] for g in gpus]
    info["gpu_indices"] = [g["index"] for g in gpus]
    info["gpus_used"] = len(gpus)
    return info


def run(args: argparse.Namespace) -> dict[str, Any]:
    gpus = select_gpus(args)
    if args.out is None:
        smoke_dir = pathlib.Path(tempfile.gettempdir()) / "searchlab-bench-smoke"
        args.out = (
            smoke_dir / "scale_smoke.json" if args.smoke else RESULTS / f"scale_{len(gpus)}gpu.json"
        )
    if args.concurrency == 0:
        args.concurrency = len(gpus) or 2
    if not args.search_timeout:  # the search's share of a run that stays under 6 min on 4 GPUs
        n = len(gpus)
        args.search_timeout = 240 if args.smoke else 200 if n >= 4 else 330 if n >= 2 else 480
    root = ensure_fake_cifar(
        pathlib.Path(args.data_dir or tempfile.gettempdir())
        / f"searchlab-fake-cifar-{args.n_train}-{args.n_test}-0",
        args.n_train,
        args.n_test,
    )
    search = ddp = None
    with tempfile.TemporaryDirectory(prefix="searchlab-scale-") as tmp:
        if args.part in ("search", "all"):
            search = run_search(args, gpus, root, pathlib.Path(tmp))
        if args.part in ("ddp", "all"):
            ddp = run_ddp(args, len(gpus), pathlib.Path(tmp))
    result: dict[str, Any] = {
        "summary": {},
        "table": {},
        "search": search,
        "ddp": ddp,
        "machine": machine(gpus),
        "config": {**vars(args), "data_dir": str(args.data_dir), "out": str(args.out)},
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "smoke": args.smoke,
    }
    keep_previous(result, args.out, args.part)
    result["summary"] = summarise(result["search"], result["ddp"], len(gpus))
    result["table"] = table(result["search"], result["ddp"])
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("search", "ddp", "all"), default="all")
    p.add_argument("--gpus", type=int, default=0, help="GPUs to use (0: all visible)")
    p.add_argument("--trials", type=int, default=64, help="searcher.max_trials")
    p.add_argument("--max-length", type=int, default=4096, help="batches of the longest trial")
    p.add_argument("--mode", default="aggressive", help="adaptive_asha mode")
    p.add_argument("--divisor", type=float, default=4.0)
    p.add_argument("--concurrency", type=int, default=0, help="trials at once (0: GPU count)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--num-workers", type=int, default=4, help="DataLoader workers per trial")
    p.add_argument("--cpus-per-trial", type=float, default=1.0)
    p.add_argument("--report-every", type=int, default=64, help="scheduling_unit (batches)")
    p.add_argument("--n-train", type=int, default=50_000)
    p.add_argument("--n-test", type=int, default=512)
    p.add_argument("--sample-ms", type=int, default=200, help="nvidia-smi sampling period")
    p.add_argument("--progress-every", type=float, default=15.0, help="seconds between lines")
    p.add_argument(
        "--search-timeout",
        type=float,
        default=0.0,
        help="interrupt the search after this many seconds (0: 200 on >= 4 GPUs, 330 on 2-3, "
        "480 on 1, 240 with --smoke)",
    )
    p.add_argument(
        "--max-pending-trials",
        type=int,
        default=0,
        help="set Tune's TUNE_MAX_PENDING_TRIALS_PG (0: leave it; Tune's auto is 1 here)",
    )
    p.add_argument("--ddp-seconds", type=float, default=30.0, help="data_parallel.py --seconds")
    p.add_argument("--data-dir", type=pathlib.Path, default=None)
    p.add_argument("--out", type=pathlib.Path, default=None)
    p.add_argument("--verbose", action="store_true", help="show searchlab's progress lines")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks the script")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything touches CUDA; Ray inherits
        args.trials, args.max_length, args.batch_size, args.num_workers = 8, 16, 16, 1
        args.report_every, args.n_train, args.n_test, args.concurrency = 2, 256, 32, 2
        args.progress_every = 10.0
    if args.smoke and args.out and args.out.resolve().is_relative_to(RESULTS):
        raise SystemExit(f"--smoke never writes under {RESULTS}; pick another --out")
    return args


def main() -> None:
    args = parse_args()
    result = run(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
