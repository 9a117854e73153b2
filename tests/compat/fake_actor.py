"""The trial actor's side of a script trial, in the test process (no Ray).

``FakeActor`` writes the cluster info a script reads (``SEARCHLAB_CLUSTER_INFO``), accepts the
script's connection in a thread, records every message and answers reports with the actions a
test gives, so the Core API and the in-trial Trainer run in the test process as in a trial.
"""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Callable
from typing import Any

from searchlab._info import ENV_VAR, ClusterInfo, SessionInfo, TrialInfo, write_cluster_info
from searchlab.core import _session
from searchlab.core._channel import Action, ChannelServer, Command, Message, Report, Stored, Unable

Policy = Callable[[Message], Action]


def go_on(message: Message) -> Action:
    return Action.GO


class FakeActor:
    """Answers a script's reports with ``policy(message)`` (GO by default)."""

    def __init__(
        self,
        root: pathlib.Path,
        monkeypatch: Any,
        *,
        hparams: dict[str, Any],
        rung_ends: list[int],
        next_rung: int = 0,
        metric: str = "validation_loss",
        unit: str = "batches",
        latest_checkpoint: str | None = None,
        config: dict[str, Any] | None = None,
        policy: Policy = go_on,
        script_length: bool = False,
        run: int = 1,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.server = ChannelServer()
        self.policy = policy
        self.messages: list[Message] = []
        self.checkpoint_dir = root / "checkpoints"
        session = SessionInfo(
            socket=self.server.address,
            token=self.server.token,
            checkpoint_dir=str(self.checkpoint_dir),
            tensorboard_dir=str(root / "tensorboard"),
            rung_ends=rung_ends,
            next_rung=next_rung,
            length_unit=unit,
            script_length=script_length,
            searcher_metric=metric,
            smaller_is_better=True,
            tune_trial_id="abc_00002",
            experiment_name="compat",
        )
        conf = config or {"searcher": {"name": "adaptive_asha", "metric": metric}}
        info = ClusterInfo(
            trial_info=TrialInfo(3, 77, 1234, hparams, conf, trial_run_id=run),
            session=session,
            latest_checkpoint=latest_checkpoint,
        )
        path = write_cluster_info(root / f"cluster-info-{run}.json", info)
        monkeypatch.setenv(ENV_VAR, str(path))
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name, raising=False)
        _session._reset_for_tests()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        channel = self.server.accept(timeout=60)
        if channel is None:
            return
        asked = False  # the last answer asked for a checkpoint: its reply needs an answer
        while (message := channel.recv()) is not None:
            self.messages.append(message)
            if isinstance(message, Report | Unable) or (isinstance(message, Stored) and asked):
                action = self.policy(message)
                asked = action is Action.CHECKPOINT
                channel.send(Command(action))
        channel.close()

    def finish(self) -> list[Message]:
        """The messages, once the script side closed its connection."""
        _session._reset_for_tests()
        self._thread.join(timeout=30)
        self.server.close()
        return self.messages

    def reports(self, group: str | None = None) -> list[Report]:
        return [m for m in self.messages if isinstance(m, Report) and group in (None, m.group)]
