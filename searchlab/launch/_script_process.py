"""One run of a trial's script: the process, its connection, and ending it cleanly.

The trial's actor starts the script with ``SEARCHLAB_CLUSTER_INFO`` pointing at the trial's
info (written beside the socket, in a private directory), reads its messages, and answers its
reports. The script runs in its own session (process group): ending a run ends the launcher's
workers too.

Example:
    >>> run = ScriptProcess(["python3", "train.py"], cwd, env, info, trial_dir / "script.log")
    >>> message = run.recv()          # a Report, Stored or Failure; None once it exited
    >>> run.answer(Action.GO)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import threading
import time
from typing import IO

from searchlab._info import ENV_VAR, ClusterInfo, write_cluster_info
from searchlab.core._channel import (
    Action,
    Channel,
    ChannelServer,
    Command,
    Message,
    Report,
    Unable,
)

__all__ = ["ScriptProcess", "gpu_uuids"]

_POLL_S = 0.2
_TERM_GRACE_S = 10.0
_TAIL_LINES = 30
_EXIT_GRACE_S = 60.0  # for a script that closed its connection to finish exiting


class ScriptProcess:
    """A running script of a trial, as its actor sees it."""

    def __init__(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        info: ClusterInfo,
        log_file: str | os.PathLike[str],
    ) -> None:
        self._server = ChannelServer()
        private = pathlib.Path(self._server.directory)
        info._session = dataclasses.replace(
            info._session, socket=self._server.address, token=self._server.token
        )
        info_file = write_cluster_info(private / "cluster-info.json", info)
        self._log_path = pathlib.Path(log_file)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(self._log_path, "ab")
        self._log_start = self._log.tell()
        self.argv = argv
        self._proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**env, ENV_VAR: str(info_file), "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._channel: Channel | None = None
        self.waiting = False  # the script waits for an answer to its last report
        self.started = time.monotonic()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None or self._channel is not None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    def recv(self, deadline: float | None = None, wait_exit: bool = True) -> Message | None:
        """The script's next message; None once it exited (and every message was read).

        With ``wait_exit=False``, None as soon as the script closed its connection: its
        interpreter may take a second more to exit (``close(wait=False)`` reaps it).

        Raises:
            TimeoutError: ``deadline`` (``time.monotonic()``) passed first.
        """
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError
            if self._channel is None:
                if self._proc.poll() is not None:
                    return None
                self._channel = self._server.accept(timeout=_POLL_S)
                continue
            try:
                message = self._channel.recv(timeout=_POLL_S)
            except TimeoutError:
                if self._proc.poll() is not None and self._quiet_after_exit():
                    self._drop_channel()
                continue
            if message is None:
                self._drop_channel(wait_exit)
                if not wait_exit:
                    return None
                continue
            self.waiting = isinstance(message, Report | Unable) or self.waiting
            return message

    def _quiet_after_exit(self) -> bool:
        """Our child exited, but a process it forked may still hold the connection open (a
        data loader's worker): give up on it after a few seconds of silence."""
        exited = getattr(self, "_exited_at", None)
        if exited is None:
            self._exited_at = time.monotonic()
            return False
        return time.monotonic() - exited > 5.0

    def _drop_channel(self, wait_exit: bool = True) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self.waiting = False
        if wait_exit and self._proc.poll() is None:
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()

    def answer(self, action: Action) -> None:
        """Answer the script's last report (or request)."""
        self.waiting = False
        if self._channel is not None:
            try:
                self._channel.send(Command(action))
            except OSError:
                self._drop_channel()

    def kill(self) -> None:
        """End the script and everything it started: SIGTERM, then SIGKILL after a grace."""
        for sig, grace in ((signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, 5.0)):
            if self._proc.poll() is not None:
                break
            try:
                os.killpg(self._proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        try:  # the launcher's workers, should any outlive it
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap(self) -> None:
        try:
            self._proc.wait(timeout=_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def output_tail(self) -> str:
        """The last lines of the script's output in this run."""
        try:
            with open(self._log_path, "rb") as f:
                f.seek(self._log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-_TAIL_LINES:])

    def close(self, wait: bool = True) -> None:
        """End the run; ``wait=False`` lets a script that is exiting finish in the background
        (killed if it has not within a minute)."""
        if self._proc.poll() is None:
            if wait:
                self.kill()
            else:
                threading.Thread(target=self._reap, daemon=True).start()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._server.close()
        self._log.close()


def gpu_uuids(ids: list[str]) -> list[str]:
    """The UUIDs of the GPUs with these indices (``nvidia-smi``; no CUDA context here)."""
    if not ids:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", ",".join(ids)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return list(ids)
    return [line.strip() for line in out.splitlines() if line.strip()]
