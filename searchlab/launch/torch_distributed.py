"""``python3 -m searchlab.launch.torch_distributed python3 train.py ...``: one process per slot.

Determined's ``determined.launch.torch_distributed``, for searchlab's trials: it starts the
script once per slot of the trial (``resources.slots_per_trial``) with torch.distributed's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, and ``USE_TORCH_DISTRIBUTED``), prefixes each line of their output with
``[rank=N]``, and ends them all when one fails; it exits with the first failure's code, or 0.
``pytorch.init()`` picks the environment up and joins the group.

Arguments before a ``--`` are launcher options: ``--nproc_per_node N`` (or ``--nproc-per-node``)
overrides the number of processes (run by hand, outside a trial, it defaults to 1).

Example (an experiment config):
    entrypoint: python3 -m searchlab.launch.torch_distributed python3 train.py --epochs 1
    resources:
      slots_per_trial: 2
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import IO

from searchlab._info import get_cluster_info
from searchlab.launch._argv import is_python

__all__ = ["launch", "main", "parse_args"]

_GRACE_S = 10.0


def parse_args(args: Sequence[str]) -> tuple[int | None, list[str]]:
    """The process count asked for (None: the trial's slots) and the script's command."""
    args = list(args)
    options: list[str] = []
    if args and args[0].partition("=")[0] == "--trial":
        options, args = args, []
    elif "--" in args:
        split = args.index("--")
        options, args = args[:split], args[split + 1 :]
    nproc: int | None = None
    i = 0
    while i < len(options):
        option = options[i]
        name, _, value = option.partition("=")
        if name in ("--nproc_per_node", "--nproc-per-node"):
            if not value:
                i += 1
                value = options[i] if i < len(options) else ""
            if not value.isdigit() or int(value) < 1:
                raise SystemExit(f"searchlab.launch: {name} needs a number >= 1, got {value!r}")
            nproc = int(value)
        elif name == "--trial":  # Determined's legacy form for a PyTorchTrial class
            raise SystemExit(
                "searchlab.launch: --trial names a PyTorchTrial class; put it in the config's "
                "entrypoint (entrypoint: model_def:MyTrial) and searchlab trains it on every slot"
            )
        else:
            raise SystemExit(f"searchlab.launch: unknown option {option!r} before --")
        i += 1
    if not args:
        raise SystemExit(
            "searchlab.launch: no script to launch; usage: python3 -m "
            "searchlab.launch.torch_distributed [--nproc_per_node N --] python3 SCRIPT.py ARGS"
        )
    return nproc, args


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pipe_lines(stream: IO[bytes], prefix: bytes, out: IO[bytes]) -> None:
    for line in iter(stream.readline, b""):
        out.write(prefix + line)
        out.flush()
    stream.close()


def launch(nproc: int, script: list[str]) -> int:
    """Run ``script`` as ``nproc`` ranks on this machine; the first failure ends them all."""
    if is_python(script[0]) and not os.path.isabs(script[0]):
        script = [sys.executable, *script[1:]]
    base = {
        **os.environ,
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "USE_TORCH_DISTRIBUTED": "True",
        "PYTHONUNBUFFERED": "1",
    }
    procs: list[subprocess.Popen[bytes]] = []
    pipes: list[threading.Thread] = []
    for rank in range(nproc):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        proc = subprocess.Popen(script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(proc)
        for stream, out in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            assert stream is not None
            thread = threading.Thread(
                target=_pipe_lines, args=(stream, f"[rank={rank}] ".encode(), out), daemon=True
            )
            thread.start()
            pipes.append(thread)

    def forward(signum: int, frame: FrameType | None) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = _wait_all(procs)
    for thread in pipes:
        thread.join(timeout=5)
    return code


def _wait_all(procs: list[subprocess.Popen[bytes]]) -> int:
    """Every rank's exit; when one fails, the others get SIGTERM (then SIGKILL)."""
    first_failure = 0
    stopping_since: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed and first_failure == 0:
            first_failure = failed[0]  # type: ignore[assignment]
            stopping_since = time.monotonic()
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
        if all(c is not None for c in codes):
            return first_failure
        if stopping_since is not None and time.monotonic() - stopping_since > _GRACE_S:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        time.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> int:
    nproc, script = parse_args(sys.argv[1:] if argv is None else argv)
    if nproc is None:
        info = get_cluster_info()
        nproc = len(info.slot_ids) if info is not None else 1
    return launch(nproc, script)


if __name__ == "__main__":
    sys.exit(main())
