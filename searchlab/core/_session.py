"""A script's line to its trial (rank 0 only): reports in lock step, checkpoints, failures.

Every part of a script that talks to the searcher (the Core API's contexts, the Trainer) goes
through the one ``TrialSession`` of its process, so a script that uses both sees one trial.

Example:
    >>> session = trial_session()          # None outside a trial and on ranks other than 0
    >>> action = session.request(Report("validation", {"loss": 0.1}, batches=100))
    >>> action is Action.GO
    True
"""

from __future__ import annotations

import atexit
import logging
import os

from searchlab._info import ClusterInfo, get_cluster_info
from searchlab.core._channel import (
    Action,
    Channel,
    Command,
    Failure,
    Message,
    Report,
    Stored,
    Unable,
    connect,
)

__all__ = ["Action", "Report", "Stored", "TrialSession", "Unable", "is_chief", "trial_session"]

logger = logging.getLogger("searchlab.core")


def is_chief() -> bool:
    """Rank 0 of the trial's processes (the only one that talks to the trial's actor)."""
    return int(os.environ.get("RANK", "0") or 0) == 0


class TrialSession:
    """The connection of a script's rank 0 to its trial's actor."""

    def __init__(self, info: ClusterInfo) -> None:
        self.info = info
        self._channel: Channel | None = connect(info._session.socket, info._session.token)
        self.preempted = False  # the actor asked the script to checkpoint and exit
        self.operations = False  # the script takes searcher operations (0.37's Core API)
        self.failed = False
        self.last_batches = 0  # steps_completed of the last report (for searcher operations)

    def request(self, message: Message) -> Action:
        """Send a report (or an answer to ``CHECKPOINT``) and wait for the actor's command."""
        if isinstance(message, Report) and message.batches >= 0:
            self.last_batches = message.batches
        if not self._send(message):
            return Action.STOP
        return self._wait()

    def notify(self, message: Message) -> None:
        """Send a message that needs no answer (a checkpoint stored on the way out)."""
        self._send(message)

    def fail(self, kind: str, message: str) -> None:
        """Tell the actor why the trial ends (``invalid_hp`` or ``fatal``); once."""
        if not self.failed:
            self.failed = True
            self._send(Failure(kind=kind, message=message))

    def handle_checkpoint_requests(self, action: Action, reason: str) -> Action:
        """For code that cannot checkpoint on request: refuse each ``CHECKPOINT`` (the actor
        then preempts) and return the first other command."""
        while action is Action.CHECKPOINT:
            action = self.request(Unable(reason=reason))
        return action

    def _send(self, message: Message) -> bool:
        if self._channel is None:
            return False
        try:
            self._channel.send(message)
            return True
        except OSError:
            self._lost()
            return False

    def _wait(self) -> Action:
        assert self._channel is not None
        reply = self._channel.recv()
        if reply is None:
            self._lost()
            return Action.STOP
        if not isinstance(reply, Command):
            raise RuntimeError(f"searchlab: the trial's actor sent {reply!r}, not a command")
        if reply.action in (Action.PREEMPT, Action.STOP):
            self.preempted = True
        return reply.action

    def _lost(self) -> None:
        """The actor is gone (its trial was stopped, or Ray ended): exit as if preempted."""
        if self._channel is not None:
            logger.warning("searchlab: lost the trial's actor; the script should exit")
            self._channel.close()
            self._channel = None
        self.preempted = True

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


_session: TrialSession | None = None


def trial_session() -> TrialSession | None:
    """This process's session: None outside a trial and on ranks other than 0."""
    global _session
    info = get_cluster_info()
    if info is None or not is_chief():
        return None
    if _session is None or _session.info is not info:
        _session = TrialSession(info)
        atexit.register(_session.close)
    return _session


def _reset_for_tests() -> None:
    global _session
    if _session is not None:
        _session.close()
    _session = None
