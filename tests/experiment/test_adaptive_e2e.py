"""Adaptive ASHA end to end on Ray (2 CPUs): real pauses, exact resumes, and the batches it costs.

One search shape throughout: 16 trials, ``max_length`` 64 batches, aggressive mode, divisor 4, so
one bracket whose rungs end at 4, 16 and 64 batches. Trials report training metrics every 2
batches, so a trial that restarted or skipped batches after a resume shows it in its reports.
"""

from __future__ import annotations

import collections
import json
import pathlib
import re
from dataclasses import dataclass
from typing import Any

import pytest

import searchlab
from searchers.adaptive import build_adaptive_plan

pytestmark = pytest.mark.ray

MODEL_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "asha_model"
MAX_LENGTH, MAX_TRIALS, DIVISOR = 64, 16, 4
RUNG_ENDS = [4, 16, 64]
REPORT_EVERY = 2  # scheduling_unit: a training report every 2 batches

_REACHED = re.compile(r"trial (\S+) reached (\d+) batches: ")
_PAUSED = re.compile(r"trial (\S+) paused at batch (\d+)")
_RESUMED = re.compile(r"trial (\S+) resumed at batch (\d+)")


def _config(*, tied: bool = False, stop_once: bool = False) -> dict[str, Any]:
    return {
        "name": "asha-e2e",
        "entrypoint": "asha_trial:AshaTrial",
        "hyperparameters": {
            "global_batch_size": 4,
            "lr": {"type": "log", "base": 10, "minval": -3, "maxval": 0},
            "tied": tied,
        },
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "smaller_is_better": True,
            "max_trials": MAX_TRIALS,
            "max_length": {"batches": MAX_LENGTH},
            "mode": "aggressive",
            "divisor": DIVISOR,
            "stop_once": stop_once,
        },
        "scheduling_unit": REPORT_EVERY,
        # Keep every checkpoint (a trial makes at most one per rung) so the tests can see them.
        "checkpoint_storage": {"save_trial_latest": len(RUNG_ENDS)},
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 7},
    }


@dataclass
class _Run:
    results: searchlab.Results
    lines: list[str]

    def training_batches(self) -> dict[str, list[int]]:
        """Each trial's training reports' ``batches``, in the order they were written."""
        metrics = self.results.metrics
        training = metrics[metrics["group"] == "training"]
        return {
            tid: [int(b) for b in rows["batches"]] for tid, rows in training.groupby("trial_id")
        }

    def trained(self) -> dict[str, int]:
        """Batches each trial trained in all (its last training report)."""
        return {tid: batches[-1] for tid, batches in self.training_batches().items()}

    def rung_results(self) -> list[tuple[str, int, float]]:
        """(trial, rung, validation_loss) of every rung result, in the order the run saw them."""
        metrics = self.results.metrics
        values = {
            (row.trial_id, int(row.batches)): float(row.validation_loss)
            for row in metrics[metrics["group"] == "validation"].itertuples()
        }
        events = []
        for line in self.lines:
            if match := _REACHED.search(line):
                trial_id, length = match.group(1), int(match.group(2))
                events.append((trial_id, RUNG_ENDS.index(length), values[trial_id, length]))
        return events

    def result_lines(self, trial_id: str) -> list[dict[str, Any]]:
        """Tune's ``result.json`` of the trial: one dict per report."""
        path = self.results.experiment_dir / trial_id / "result.json"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def restores(self, trial_id: str) -> int:
        """How many times Tune restored the trial from a checkpoint (``iterations_since_restore``
        starts again at 1 after each restore)."""
        starts = [r for r in self.result_lines(trial_id) if r["iterations_since_restore"] == 1]
        return len(starts) - 1

    def matches(self, pattern: re.Pattern[str]) -> list[tuple[str, int]]:
        return [(m.group(1), int(m.group(2))) for line in self.lines if (m := pattern.search(line))]


def _run(tmp_path: pathlib.Path, **config: bool) -> _Run:
    lines: list[str] = []
    results = searchlab.run(
        _config(**config), model_dir=MODEL_DIR, storage_path=tmp_path, echo=lines.append
    )
    return _Run(results, lines)


def _promotion_oracle(events: list[tuple[str, int, float]]) -> dict[str, int]:
    """The rung each trial must end at under SPEC.md's promotion rule, for results in this order.

    Written from the SPEC's pseudo-code, independently of ``searchers.adaptive``.
    """
    rungs: list[list[list[Any]]] = [[] for _ in RUNG_ENDS]  # entries [value, trial, promoted]
    final: dict[str, int] = {}
    for trial_id, k, value in events:
        final.setdefault(trial_id, 0)
        if k == len(RUNG_ENDS) - 1:
            continue
        rung = rungs[k]
        old, new = int(len(rung) / DIVISOR), int((len(rung) + 1) / DIVISOR)
        idx = next((i for i, entry in enumerate(rung) if entry[0] > value), len(rung))
        now = idx < new
        rung.insert(idx, [value, trial_id, now])
        if now:
            final[trial_id] = k + 1
        elif new != old and not rung[old][2]:
            rung[old][2] = True
            final[rung[old][1]] = k + 1
    return final


def _stopping_oracle(events: list[tuple[str, int, float]]) -> dict[str, int]:
    """The rung each trial must end at under SPEC.md's stopping rule (``stop_once: true``)."""
    rungs: list[list[float]] = [[] for _ in RUNG_ENDS]
    final: dict[str, int] = {}
    for trial_id, k, value in events:
        rung = rungs[k]
        idx = next((i for i, v in enumerate(rung) if v >= value), len(rung))
        rung.insert(idx, value)
        goes_on = k < len(RUNG_ENDS) - 1 and idx < max(int(len(rung) / DIVISOR), 1)
        final[trial_id] = k + 1 if goes_on else k
    return final


def _assert_contiguous_reports(run: _Run) -> None:
    """Every trial's training reports go 2, 4, 6, ... once each: nothing retrained or skipped."""
    batches = run.training_batches()
    assert len(batches) == MAX_TRIALS
    for trial_id, seen in batches.items():
        expected = list(range(REPORT_EVERY, seen[-1] + 1, REPORT_EVERY))
        assert seen == expected, f"trial {trial_id} reported batches {seen}"
        assert seen[-1] in RUNG_ENDS, f"trial {trial_id} trained past a rung end: {seen[-1]}"


def _checkpoint_batches(run: _Run, trial_id: str) -> list[int]:
    """``batches_trained`` of each checkpoint Tune kept for the trial (each with state-dict.pth)."""
    found = []
    for ckpt in sorted((run.results.experiment_dir / trial_id).glob("checkpoint_*")):
        assert (ckpt / "state-dict.pth").is_file(), f"{ckpt} has no state-dict.pth"
        found.append(json.loads((ckpt / "metadata.json").read_text())["batches_trained"])
    return found


def test_plan_of_this_search_trains_160_batches_when_results_arrive_best_first() -> None:
    plan = build_adaptive_plan(MAX_LENGTH, MAX_TRIALS, mode="aggressive", divisor=DIVISOR)

    assert [(b.num_rungs, b.num_trials, b.rung_ends) for b in plan.brackets] == [(3, 16, RUNG_ENDS)]
    assert plan.trials_per_length() == {4: 12, 16: 3, 64: 1}
    assert plan.total_length() == plan.total_length(stop_once=True) == 160

    def cost(rung0_values: list[float]) -> int:
        events = [(f"t{i}", 0, v) for i, v in enumerate(rung0_values)]
        rung1 = [tid for tid, rung in _promotion_oracle(events).items() if rung >= 1]
        events += [(tid, 1, float(i)) for i, tid in enumerate(rung1)]
        return sum(RUNG_ENDS[rung] for rung in _promotion_oracle(events).values())

    # The plan counts what the promotion rule trains when each result ranks behind the earlier
    # ones; a newcomer that beats promoted trials goes on as well, so the order matters.
    assert cost([float(i) for i in range(16)]) == plan.total_length()
    assert cost([float(-i) for i in range(16)]) > plan.total_length()


def test_promotion_pauses_and_resumes_trials_and_trains_the_plans_batches(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    # Every trial reports the same loss: ties rank newcomers last, so no result is promoted on
    # arrival and each rung promotes exactly int(n / 4) of its n results, whatever their order.
    plan = build_adaptive_plan(MAX_LENGTH, MAX_TRIALS, mode="aggressive", divisor=DIVISOR)
    run = _run(tmp_path, tied=True)

    _assert_contiguous_reports(run)
    trained = run.trained()
    assert sum(trained.values()) == plan.total_length() == 160
    assert dict(sorted(collections.Counter(trained.values()).items())) == plan.trials_per_length()

    trials = run.results.trials.set_index("trial_id")
    assert list(trials["bracket"]) == [0] * MAX_TRIALS
    assert (trials["rung"] >= 0).sum() == 16
    assert (trials["rung"] >= 1).sum() == 4
    assert (trials["rung"] == 2).sum() == 1
    assert (trials["state"] == "COMPLETED").all()
    for trial_id, batches in trained.items():
        assert RUNG_ENDS[int(trials.loc[trial_id, "rung"])] == batches

    paused, resumed = run.matches(_PAUSED), run.matches(_RESUMED)
    promoted = [tid for tid in trained if trials.loc[tid, "rung"] >= 1]
    for trial_id in promoted:
        rung = int(trials.loc[trial_id, "rung"])
        # It paused at each rung end it reached short of the last (to wait for the rung's
        # decision), and was resumed from each of those but the one it ended at.
        assert [b for t, b in paused if t == trial_id] == RUNG_ENDS[: min(rung + 1, 2)]
        assert [b for t, b in resumed if t == trial_id] == RUNG_ENDS[:rung]
        assert run.restores(trial_id) == rung
        assert _checkpoint_batches(run, trial_id) == RUNG_ENDS[: rung + 1]
    # The 12 trials that never went on were paused once and never came back.
    for trial_id in set(trained) - set(promoted):
        assert [b for t, b in paused if t == trial_id] == [4]
        assert run.restores(trial_id) == 0
        assert _checkpoint_batches(run, trial_id) == [4]


def test_promotion_follows_the_asha_rule_with_real_results(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    plan = build_adaptive_plan(MAX_LENGTH, MAX_TRIALS, mode="aggressive", divisor=DIVISOR)
    run = _run(tmp_path)

    _assert_contiguous_reports(run)
    expected = _promotion_oracle(run.rung_results())
    trained = run.trained()
    assert trained == {tid: RUNG_ENDS[rung] for tid, rung in expected.items()}
    trials = run.results.trials.set_index("trial_id")
    assert trials["rung"].to_dict() == expected
    assert list(trials["bracket"]) == [0] * MAX_TRIALS
    # A newcomer that beats the trials promoted so far goes on at once, so the plan's count is
    # what the search costs at least.
    assert sum(trained.values()) >= plan.total_length()
    assert (trials["rung"] >= 1).sum() >= 4
    # Every trial that went on after pausing was resumed from its checkpoint, not restarted.
    for trial_id, batches in run.matches(_RESUMED):
        assert batches in RUNG_ENDS[:-1]
        assert run.restores(trial_id) >= 1


def test_stop_once_never_pauses_or_resumes_a_trial(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    run = _run(tmp_path, stop_once=True)

    assert run.matches(_PAUSED) == []
    assert run.matches(_RESUMED) == []
    _assert_contiguous_reports(run)
    trained = run.trained()
    for trial_id in trained:
        assert run.restores(trial_id) == 0, f"trial {trial_id} was restored from a checkpoint"
    expected = _stopping_oracle(run.rung_results())
    assert trained == {tid: RUNG_ENDS[rung] for tid, rung in expected.items()}
    trials = run.results.trials.set_index("trial_id")
    assert trials["rung"].to_dict() == expected
    assert (trials["state"] == "COMPLETED").all()


def test_a_trial_resumed_soon_after_its_pause_keeps_every_report(
    ray_session: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two trials, rungs at 2 and 4 batches, one at a time, tied results: A trains 2 batches and
    # pauses, B trains 2 and reports, which resumes A at once. A's second batch takes longer
    # than Tune's period for syncing trial logs to the storage path, so a sync catches A's log
    # with only its first report, and the resume comes before the next sync: Tune's loggers
    # used to copy that stale log back over the full one, losing A's reports at batch 2.
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "3")
    config = _config(tied=True)
    config["hyperparameters"]["slow_once"] = {"path": str(tmp_path / "slow"), "seconds": 3.5}
    config["searcher"].update(
        max_trials=2, max_length={"batches": 4}, divisor=2, max_concurrent_trials=1
    )
    config["scheduling_unit"] = 1
    lines: list[str] = []
    results = searchlab.run(
        config, model_dir=MODEL_DIR, storage_path=tmp_path / "runs", echo=lines.append
    )
    run = _Run(results, lines)

    trials = results.trials.set_index("trial_id")
    (resumed,) = [tid for tid in trials.index if trials.loc[tid, "rung"] == 1]
    assert run.restores(resumed) == 1
    assert run.training_batches()[resumed] == [1, 2, 3, 4]
    metrics = results.metrics
    validations = metrics[(metrics["trial_id"] == resumed) & (metrics["group"] == "validation")]
    assert list(validations["batches"]) == [2, 4]


def test_a_pause_hands_its_worker_to_the_next_trial_and_starts_no_other(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    # One trial at a time on 2 CPUs, so a CPU is free for a second worker. Tune hands a
    # trial to a worker in the step it gets it: while a pausing trial's worker still saved
    # it, that used to be a new worker process, which Tune dropped for the freed worker once
    # the pause ended. The dropped worker still built its trial, and Tune waited for it at
    # the end. Now every worker that builds a trial trains it.
    log = tmp_path / "builds.log"
    config = _config(tied=True)
    config["hyperparameters"]["build_log"] = str(log)
    config["searcher"].update(max_trials=8, max_concurrent_trials=1)
    lines: list[str] = []
    results = searchlab.run(
        config, model_dir=MODEL_DIR, storage_path=tmp_path / "runs", echo=lines.append
    )

    events = [line.split() for line in log.read_text().splitlines()]
    built = collections.Counter(pid for pid, event in events if event == "build")
    trained = collections.Counter(pid for pid, event in events if event == "train")
    assert len(results.trials) == 8
    assert any("paused at batch" in line for line in lines)
    assert built == trained, f"builds that trained nothing, by worker: {built - trained}"
    assert len(built) == 1  # one trial at a time: one worker throughout
