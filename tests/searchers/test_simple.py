"""Single, grid and random search as SearchMethods: hand-out, decisions, InvalidHP, state."""

from __future__ import annotations

import json
from typing import Any

import pytest

from searchers._base import Action, Decision, ExitReason, TrialStart
from searchers._simple import GridSearch, RandomSearch, SingleSearch
from searchers._space import HyperparameterSpace
from searchers._tpe import TPESampler
from searchlab.config import load_experiment_config

RANGES = {
    "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
    "layers": {"type": "int", "minval": 1, "maxval": 8},
    "act": {"type": "categorical", "vals": ["relu", "gelu"]},
    "gbs": 64,
}
GRID = {
    "optimizer": {"lr": {"type": "double", "minval": 0.1, "maxval": 0.5, "count": 3}},
    "act": {"type": "categorical", "vals": ["relu", "gelu"]},
}


def started(search: Any, trial_id: str) -> TrialStart:
    start = search.start_trial(trial_id)
    assert start is not None, f"no trial started for {trial_id}"
    return start


def start_all(search: Any, prefix: str = "t", limit: int = 100) -> list[Any]:
    starts = []
    for i in range(limit):
        start = search.start_trial(f"{prefix}{i}")
        if start is None:
            break
        starts.append(start)
    return starts


def random_search(seed: int = 1, max_trials: int = 5, **kwargs: Any) -> RandomSearch:
    return RandomSearch(HyperparameterSpace(RANGES), 100, max_trials, seed=seed, **kwargs)


# --- shared behaviour -----------------------------------------------------------------------


def all_methods() -> list[Any]:
    return [
        SingleSearch(HyperparameterSpace(RANGES), 100, seed=3),
        GridSearch(HyperparameterSpace(GRID), 100, seed=3),
        random_search(seed=3),
    ]


@pytest.mark.parametrize("search", all_methods(), ids=["single", "grid", "random"])
def test_trials_train_to_max_length_then_stop(search: Any) -> None:
    start = search.start_trial("t0")
    assert start.train_to == 100 and start.rung_ends == [100] and start.bracket is None
    assert search.report("t0", 50, 0.5) == Decision(Action.CONTINUE, train_to=100)
    assert search.report("t0", 100, 0.4) == Decision(Action.STOP)
    assert search.next_resume() is None
    assert search.closed_trials() == []


@pytest.mark.parametrize("search", all_methods(), ids=["single", "grid", "random"])
def test_trial_seeds_are_in_range_and_differ(search: Any) -> None:
    seeds = [s.extra["trial_seed"] for s in start_all(search)]
    assert seeds and all(isinstance(s, int) and 0 <= s < 2**31 for s in seeds)
    assert len(set(seeds)) == len(seeds)


@pytest.mark.parametrize("search", all_methods(), ids=["single", "grid", "random"])
def test_a_running_trial_id_cannot_start_again(search: Any) -> None:
    search.start_trial("t0")
    with pytest.raises(ValueError, match="trial 't0' is already running"):
        search.start_trial("t0")


def test_trial_seeds_follow_the_experiment_seed() -> None:
    def seeds(seed: int) -> list[int]:
        return [s.extra["trial_seed"] for s in start_all(random_search(seed=seed))]

    assert seeds(11) == seeds(11)
    assert seeds(11) != seeds(12)


def test_concurrency_cap() -> None:
    search = GridSearch(HyperparameterSpace(GRID), 100, seed=0, max_concurrent_trials=2)
    assert search.start_trial("a") is not None and search.start_trial("b") is not None
    assert search.start_trial("c") is None
    search.report("a", 100, 1.0)
    assert search.start_trial("c") is not None


@pytest.mark.parametrize("bad", [{"max_length": 0}, {"max_concurrent_trials": -1}])
def test_bad_arguments(bad: dict[str, Any]) -> None:
    kwargs = {"max_length": 10, **bad}
    max_length = kwargs.pop("max_length")
    with pytest.raises(ValueError, match=next(iter(bad))):
        GridSearch(HyperparameterSpace(GRID), max_length, seed=0, **kwargs)


# --- single --------------------------------------------------------------------------------


def test_single_hands_out_one_trial_with_the_constants() -> None:
    search = SingleSearch(HyperparameterSpace({"lr": 0.1, "opt": {"name": "sgd"}}), 10, seed=0)
    assert not search.finished
    assert started(search, "t0").hparams == {"lr": 0.1, "opt": {"name": "sgd"}}
    assert search.finished
    assert search.start_trial("t1") is None


def test_single_samples_ranges_from_the_seed() -> None:
    def hparams(seed: int) -> dict[str, Any]:
        return started(SingleSearch(HyperparameterSpace(RANGES), 10, seed=seed), "t").hparams

    assert hparams(4) == hparams(4)
    assert hparams(4) != hparams(5)
    assert 1 <= hparams(4)["layers"] <= 8 and hparams(4)["gbs"] == 64


def test_single_invalid_hp_is_dropped() -> None:
    search = SingleSearch(HyperparameterSpace(RANGES), 10, seed=0)
    search.start_trial("t0")
    search.trial_exited("t0", ExitReason.INVALID_HP)
    assert search.start_trial("t1") is None and search.finished
    assert search.invalid_trials == 1


# --- grid ----------------------------------------------------------------------------------


def test_grid_hands_out_every_point_in_order() -> None:
    search = GridSearch(HyperparameterSpace(GRID), 10, seed=0)
    assert search.num_points == 6
    points = [(s.hparams["act"], s.hparams["optimizer"]["lr"]) for s in start_all(search)]
    assert points == [
        ("relu", pytest.approx(0.1)),
        ("relu", pytest.approx(0.3)),
        ("relu", pytest.approx(0.5)),
        ("gelu", pytest.approx(0.1)),
        ("gelu", pytest.approx(0.3)),
        ("gelu", pytest.approx(0.5)),
    ]
    assert search.finished


def test_grid_invalid_hp_drops_the_point() -> None:
    search = GridSearch(HyperparameterSpace(GRID), 10, seed=0)
    first = started(search, "t0")
    search.trial_exited("t0", ExitReason.INVALID_HP)
    rest = start_all(search, prefix="u")
    assert len(rest) == 5
    assert first.hparams not in [s.hparams for s in rest]


def test_grid_state_round_trip() -> None:
    space = HyperparameterSpace(GRID)
    search = GridSearch(space, 10, seed=9)
    start_all(search, limit=2)
    restored = GridSearch(space, 10, seed=9)
    restored.load_state_dict(json.loads(json.dumps(search.state_dict())))
    assert start_all(restored, prefix="x") == start_all(search, prefix="x")
    assert restored.finished


def test_grid_state_from_another_grid_is_refused() -> None:
    search = GridSearch(HyperparameterSpace(GRID), 10, seed=0)
    other = GridSearch(
        HyperparameterSpace({"a": {"type": "categorical", "vals": [1, 2]}}), 10, seed=0
    )
    with pytest.raises(ValueError, match="the grid has 2 points, but the saved search had 6"):
        other.load_state_dict(search.state_dict())
    with pytest.raises(
        ValueError, match="cannot restore a random search from state of kind 'grid'"
    ):
        random_search().load_state_dict(search.state_dict())


# --- random --------------------------------------------------------------------------------


def test_random_same_seed_same_sequence_and_different_seeds_differ() -> None:
    def sequence(seed: int) -> list[dict[str, Any]]:
        return [s.hparams for s in start_all(random_search(seed=seed))]

    assert len(sequence(1)) == 5
    assert sequence(1) == sequence(1)
    assert sequence(1) != sequence(2)


@pytest.mark.parametrize("invalid", [0, 1, 3])
def test_random_invalid_hp_is_replaced_and_not_counted(invalid: int) -> None:
    search = random_search(max_trials=3)
    handed_out = 0
    for i in range(invalid):
        assert search.start_trial(f"bad{i}") is not None
        search.trial_exited(f"bad{i}", ExitReason.INVALID_HP)
        handed_out += 1
    good = start_all(search, prefix="good")
    assert len(good) == 3
    assert handed_out + len(good) == 3 + invalid
    assert search.invalid_trials == invalid


def test_random_replacement_is_a_new_sample() -> None:
    search = random_search(max_trials=1)
    bad = started(search, "bad")
    search.trial_exited("bad", ExitReason.INVALID_HP)
    assert started(search, "good").hparams != bad.hparams


def test_random_finished_waits_for_running_trials() -> None:
    search = random_search(max_trials=2)
    start_all(search)
    assert not search.finished  # a running trial may still raise InvalidHP
    search.report("t0", 100, 1.0)
    search.trial_exited("t1", ExitReason.INVALID_HP)
    assert not search.finished
    assert search.start_trial("t2") is not None
    search.trial_exited("t2", ExitReason.ERRORED)  # errors are not replaced
    assert search.start_trial("t3") is None
    assert search.finished


def test_exits_after_stop_change_nothing() -> None:
    search = random_search(max_trials=1)
    search.start_trial("t0")
    search.report("t0", 100, 1.0)
    search.trial_exited("t0", ExitReason.INVALID_HP)
    assert search.start_trial("t1") is None and search.finished


def test_random_state_round_trip_continues_the_stream() -> None:
    uninterrupted = random_search(seed=21, max_trials=6)
    expected = start_all(uninterrupted)

    first = random_search(seed=21, max_trials=6)
    head = start_all(first, limit=3)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = random_search(seed=21, max_trials=6)
    resumed.load_state_dict(state)
    tail = [resumed.start_trial(f"t{i}") for i in range(3, 7)]
    assert head + tail[:3] == expected
    assert tail[3] is None
    assert resumed.active_trials == sorted(f"t{i}" for i in range(6))


class RecordingSampler:
    """A sampler that records what the search tells it."""

    def __init__(self) -> None:
        self.observed: list[tuple[str, int, float]] = []
        self.forgotten: list[str] = []

    def sample(self, trial_id: str) -> dict[str, Any]:
        return {"trial": trial_id}

    def observe(self, trial_id: str, length: int, value: float) -> None:
        self.observed.append((trial_id, length, value))

    def forget(self, trial_id: str) -> None:
        self.forgotten.append(trial_id)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@pytest.mark.parametrize(("smaller_is_better", "seen"), [(True, 0.25), (False, -0.25)])
def test_random_passes_sign_normalised_results_to_its_sampler(
    smaller_is_better: bool, seen: float
) -> None:
    sampler = RecordingSampler()
    search = random_search(max_trials=2, sampler=sampler, smaller_is_better=smaller_is_better)
    assert started(search, "a").hparams == {"trial": "a"}
    search.report("a", 50, 0.25)
    search.report("a", 100, float("nan"))
    search.start_trial("b")
    search.trial_exited("b", ExitReason.INVALID_HP)
    assert sampler.observed == [("a", 50, seen)]
    assert sampler.forgotten == ["b"]


# --- from a config -------------------------------------------------------------------------


def config(searcher: dict[str, Any], hparams: dict[str, Any]) -> Any:
    return load_experiment_config(
        {
            "entrypoint": "m:T",
            "hyperparameters": hparams,
            "searcher": {"metric": "loss", "max_length": {"epochs": 3}, **searcher},
            "reproducibility": {"experiment_seed": 5},
        }
    )


def test_from_config() -> None:
    single = SingleSearch.from_config(config({"name": "single"}, {"lr": 0.1}))
    assert started(single, "a").train_to == 3
    grid = GridSearch.from_config(config({"name": "grid", "max_concurrent_trials": 1}, GRID))
    assert grid.num_points == 6 and grid.max_concurrent_trials == 1
    rand = RandomSearch.from_config(
        config({"name": "random", "max_trials": 2, "sampler": "tpe"}, RANGES)
    )
    assert isinstance(rand.sampler, TPESampler) and rand.max_trials == 2 and rand.seed == 5
    with pytest.raises(ValueError, match="RandomSearch needs a random searcher config, got grid"):
        RandomSearch.from_config(config({"name": "grid"}, GRID))
