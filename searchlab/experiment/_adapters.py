"""Ray Tune adapters around a pure ``SearchMethod``: a gated searcher and a scheduler.

Tune asks the searcher for new trials and the scheduler for what a running trial does next and
which trial to start. Both share one ``SearchMethod``, so "promote a paused trial or start a new
one" is decided in one place: the searcher answers "ask later" while a promotion is due, and the
scheduler hands Tune the promoted trial before any new one.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from searchers._base import Action, ExitReason, SearchMethod
from searchlab.experiment._spec import HPARAMS_KEY, TRIAL_KEY
from searchlab.experiment._trial_runner import (
    FATAL_KEY,
    INVALID_HP_KEY,
    LENGTH_KEY,
    TRIAL_ERROR_KEY,
)

__all__ = ["GatedSearcher", "RunControl", "SearchScheduler"]

_DECISIONS = {
    Action.CONTINUE: TrialScheduler.CONTINUE,
    Action.PAUSE: TrialScheduler.PAUSE,
    Action.STOP: TrialScheduler.STOP,
}


class RunControl:
    """What the driver tells the adapters: an interrupt to honour, a restore to settle."""

    def __init__(self, *, restored: bool = False) -> None:
        self.interrupted = False  # Ctrl-C: pause every trial at a checkpoint, start nothing
        self.drained = False  # interrupted and no trial runs any more: the run ends
        self.restored = restored  # the first scheduling step re-pauses trials waiting at rungs


class GatedSearcher(Searcher):
    """Hands Tune the search method's new trials; None ("ask later") while promotions are due."""

    def __init__(
        self,
        method: SearchMethod,
        metric: str,
        smaller_is_better: bool,
        control: RunControl | None = None,
    ) -> None:
        super().__init__(metric=metric, mode="min" if smaller_is_better else "max")
        self.metric_name = metric  # Searcher.metric is Optional; this one is always set
        self.method = method
        self.control = control or RunControl()
        self.resume_queue: list[str] = []
        self.trial_info: dict[str, dict[str, Any]] = {}

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        return True

    # Tune's contract: a dict of config, None for "ask again later", or ``Searcher.FINISHED``
    # (a str) when no trial will ever be suggested again; its annotation leaves out the str.
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        self._drain_resumes()
        if self.resume_queue or self.control.interrupted:
            return None
        start = self.method.start_trial(trial_id)
        if start is None:
            return Searcher.FINISHED if self.method.finished else None
        info = {
            "rung_ends": list(start.rung_ends),
            "bracket": start.bracket,
            "trial_seed": int(start.extra.get("trial_seed", 0)),
        }
        self.trial_info[trial_id] = info
        return {HPARAMS_KEY: start.hparams, TRIAL_KEY: info}

    def _drain_resumes(self) -> None:
        while (nxt := self.method.next_resume()) is not None:
            self.resume_queue.append(nxt[0])

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if error:
            self.method.trial_exited(trial_id, ExitReason.ERRORED)
        elif result and result.get(INVALID_HP_KEY):
            self.method.trial_exited(trial_id, ExitReason.INVALID_HP)
        elif result and (result.get(FATAL_KEY) or result.get(TRIAL_ERROR_KEY)):
            self.method.trial_exited(trial_id, ExitReason.ERRORED)
        else:
            self.method.trial_exited(trial_id, ExitReason.COMPLETED)

    def state_dict(self) -> dict[str, Any]:
        return {
            "method": self.method.state_dict(),
            "resume_queue": list(self.resume_queue),
            "trial_info": self.trial_info,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.method.load_state_dict(state["method"])
        self.resume_queue = list(state["resume_queue"])
        self.trial_info = dict(state["trial_info"])

    def save(self, checkpoint_path: str) -> None:
        pathlib.Path(checkpoint_path).write_text(json.dumps(self.state_dict()))

    def restore(self, checkpoint_path: str) -> None:
        self.load_state_dict(json.loads(pathlib.Path(checkpoint_path).read_text()))


class SearchScheduler(FIFOScheduler):
    """Turns rung results into CONTINUE/PAUSE/STOP and resumes promoted trials first."""

    def __init__(self, searcher: GatedSearcher, smaller_is_better: bool) -> None:
        super().__init__()
        self._searcher = searcher
        self._searcher_metric = searcher.metric_name
        self._worst = math.inf if smaller_is_better else -math.inf
        self._chosen: set[str] = set()
        self._pausing: set[str] = set()

    @property
    def method(self) -> SearchMethod:
        return self._searcher.method

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        decision = self._decide(tune_controller, trial, result)
        if self._searcher.control.interrupted and decision == TrialScheduler.CONTINUE:
            return TrialScheduler.CONTINUE if result.get("done") else TrialScheduler.PAUSE
        return decision

    def _decide(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        if LENGTH_KEY not in result:
            return TrialScheduler.CONTINUE
        value = result.get(self._searcher_metric)
        value = float(value) if value is not None else math.nan
        if not math.isfinite(value):
            value = self._worst  # NaN or inf: the worst possible result at this rung
        decision = self.method.report(trial.trial_id, int(result[LENGTH_KEY]), value)
        self._stop_closed(tune_controller)
        if result.get("done"):
            return TrialScheduler.CONTINUE  # the trial ends by itself at its last rung
        return _DECISIONS[decision.action]

    def _stop_closed(self, tune_controller: Any) -> None:
        closed = set(self.method.closed_trials())
        if not closed:
            return
        for trial in tune_controller.get_trials():
            if trial.trial_id in closed and trial.status == Trial.PAUSED:
                tune_controller.stop_trial(trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        self._searcher._drain_resumes()
        trials = {t.trial_id: t for t in tune_controller.get_trials()}
        control = self._searcher.control
        if control.restored:
            control.restored = False
            self._repause(tune_controller, trials)
        if control.interrupted:
            self._pause_everything(tune_controller, trials)
            return None
        queue = self._searcher.resume_queue
        for trial_id in list(queue):
            trial = trials.get(trial_id)
            if trial is None or trial.status in (Trial.TERMINATED, Trial.ERROR):
                queue.remove(trial_id)
            elif trial.status == Trial.PAUSED:
                self._chosen.add(trial_id)
                return trial
            elif trial_id in self._chosen:
                queue.remove(trial_id)  # staged by Tune already
                self._chosen.discard(trial_id)
        for trial in trials.values():
            if trial.status == Trial.PENDING:
                return trial
        if self.method.finished and not queue:
            for trial in trials.values():
                if trial.status == Trial.PAUSED:
                    tune_controller.stop_trial(trial)
        return None

    def _repause(self, tune_controller: Any, trials: dict[str, Trial]) -> None:
        """After a restore Tune brings every unfinished trial back as PENDING; those waiting at
        a rung for a promotion must stay paused until the rungs promote them."""
        waiting = set(self.method.paused_trials()) - set(self._searcher.resume_queue)
        for trial_id in waiting:
            trial = trials.get(trial_id)
            if trial is not None and trial.status == Trial.PENDING:
                tune_controller._set_trial_status(trial, Trial.PAUSED)

    def _pause_everything(self, tune_controller: Any, trials: dict[str, Trial]) -> None:
        """Ctrl-C: running trials pause with a checkpoint; queued ones stay unstarted."""
        running = False
        for trial in trials.values():
            if trial.status == Trial.RUNNING:
                running = True
                if trial.trial_id not in self._pausing:
                    self._pausing.add(trial.trial_id)
                    tune_controller.pause_trial(trial, should_checkpoint=True)
            elif trial.status == Trial.PENDING and trial.trial_id not in self._pausing:
                tune_controller._set_trial_status(trial, Trial.PAUSED)
        control = self._searcher.control
        if not running and not control.drained:
            control.drained = True
            # Tune's own way to end a run resumably (its SIGUSR1 handler): the trials keep
            # their PAUSED state in the saved experiment, for `searchlab resume`.
            os.kill(os.getpid(), signal.SIGUSR1)

    def debug_string(self) -> str:
        return "searchlab scheduler"
