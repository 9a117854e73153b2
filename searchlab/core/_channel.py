"""The line between a script trial's process and its Ray actor: typed messages over a Unix socket.

The script (its rank 0) reports in lock step: after each ``Report`` it waits for the actor's
``Command`` (go on, checkpoint now, preempt, stop), so the script never runs ahead of what the
searcher has seen, and a checkpoint taken when the actor asks is at the reported batch.
Frames are a 4-byte big-endian length and a JSON object whose ``type`` names the message.
No torch and no Ray here: both sides import it.

Example:
    >>> server = ChannelServer(tmp_dir)
    >>> child = connect(server.address, server.token)   # in the script
    >>> actor = server.accept(timeout=5.0)
    >>> child.send(Report("training", {"loss": 0.5}, batches=10))
    >>> actor.recv()
    Report(group='training', metrics={'loss': 0.5}, batches=10, ...)
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import secrets
import shutil
import socket
import struct
import tempfile
from typing import Any

__all__ = [
    "Action",
    "Channel",
    "ChannelServer",
    "Command",
    "Failure",
    "Hello",
    "Message",
    "Report",
    "Stored",
    "Unable",
    "connect",
]

_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 2**20  # a report is small; this only stops a runaway peer


class Action(str, enum.Enum):
    """What the actor tells the script after a report."""

    GO = "go"  # train on
    CHECKPOINT = "checkpoint"  # store a checkpoint at this batch, answer, then wait again
    PREEMPT = "preempt"  # checkpoint and exit: the trial pauses (it resumes from it)
    STOP = "stop"  # the searcher is done with the trial: checkpoint and exit


@dataclasses.dataclass(frozen=True)
class Hello:
    """The script's first message: who it is."""

    token: str
    pid: int


@dataclasses.dataclass(frozen=True)
class Report:
    """Metrics of one report. ``searcher_length``: this validation ends a rung at that length
    (the Trainer knows); ``by_time_metric``: the actor may read the rung from the metrics
    (Core API validations, unless the script takes searcher operations)."""

    group: str
    metrics: dict[str, Any]
    batches: int
    epochs: float | None = None
    searcher_length: int | None = None
    by_time_metric: bool = False
    checkpoint: str | None = None  # a checkpoint stored at this report's batch
    first_non_finite: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Stored:
    """A checkpoint the script stored (a directory the actor may copy)."""

    path: str
    batches: int | None = None


@dataclasses.dataclass(frozen=True)
class Unable:
    """The answer to ``CHECKPOINT`` from code that cannot checkpoint on request (Core API)."""

    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Failure:
    """The trial cannot go on: ``invalid_hp`` (replace it) or ``fatal`` (a user error)."""

    kind: str
    message: str
    config_path: str | None = None  # the config field a fatal error is about


@dataclasses.dataclass(frozen=True)
class Command:
    action: Action


Message = Hello | Report | Stored | Unable | Failure | Command
_TYPES: dict[str, type[Any]] = {
    cls.__name__.lower(): cls for cls in (Hello, Report, Stored, Unable, Failure, Command)
}


def _encode(message: Message) -> bytes:
    data = dataclasses.asdict(message)
    data["type"] = type(message).__name__.lower()
    body = json.dumps(data, default=_plain).encode()
    return _HEADER.pack(len(body)) + body


def _plain(value: Any) -> Any:
    """JSON for what ``json`` does not know: tensors and arrays (``tolist``), enums, paths."""
    if isinstance(value, enum.Enum):
        return value.value
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return str(value)


def _decode(body: bytes) -> Message:
    data = json.loads(body)
    cls = _TYPES.get(data.pop("type", None))
    if cls is None:
        raise ValueError(f"unknown message {body[:80]!r}")
    if cls is Command:
        data["action"] = Action(data["action"])
    message: Message = cls(**data)
    return message


class Channel:
    """One end of a connection: ``send`` a message, ``recv`` the next (None at the end)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def send(self, message: Message) -> None:
        self._sock.settimeout(None)
        self._sock.sendall(_encode(message))

    def recv(self, timeout: float | None = None) -> Message | None:
        """The next message; None when the peer closed; ``TimeoutError`` after ``timeout`` s."""
        self._sock.settimeout(timeout)
        while True:
            if len(self._buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buffer)
                if size > _MAX_FRAME:
                    raise ValueError(f"a message of {size} bytes; the peer is not searchlab's")
                end = _HEADER.size + size
                if len(self._buffer) >= end:
                    body, self._buffer = self._buffer[_HEADER.size : end], self._buffer[end:]
                    return _decode(body)
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                raise
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class ChannelServer:
    """The actor's end: a Unix socket in a private directory that only its script joins."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._dir = tempfile.mkdtemp(prefix="searchlab-trial-", dir=directory)  # mode 0700
        self.address = os.path.join(self._dir, "trial.sock")
        self.token = secrets.token_hex(16)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(4)

    def accept(self, timeout: float) -> Channel | None:
        """The script's connection once it said hello with the token; None after ``timeout``."""
        self._sock.settimeout(timeout)
        try:
            conn, _ = self._sock.accept()
        except TimeoutError:
            return None
        channel = Channel(conn)
        try:
            hello = channel.recv(timeout=10.0)
        except (TimeoutError, ValueError):
            hello = None
        if not isinstance(hello, Hello) or not secrets.compare_digest(hello.token, self.token):
            channel.close()
            return None
        return channel

    @property
    def directory(self) -> str:
        """The private directory of the socket (files beside it are the actor's)."""
        return self._dir

    def close(self) -> None:
        """Stop listening and remove the directory (and what else the actor put there)."""
        try:
            self._sock.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


def connect(address: str, token: str) -> Channel:
    """The script's end, introduced to the actor."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    channel = Channel(sock)
    channel.send(Hello(token=token, pid=os.getpid()))
    return channel
