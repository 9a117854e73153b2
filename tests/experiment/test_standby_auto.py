"""``SEARCHLAB_STANDBY=auto``: standby decided once Ray is up, from the cluster and the config.

Two trials ready per GPU where the search can use them, one where only that many fit, none
where standby cannot run (no GPUs, trials that cannot share a GPU, ``max_restarts: 0``), each
said in one line; the decision is what ``experiment.json`` records for a resume. A real search
on a Ray node that declares one GPU (the trials train on the CPU) runs more than one actor
on it.
"""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any

import pytest
from runner_steps import asha_model_dir, run_search_script

import searchlab
from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError
from searchlab.experiment._resources import auto_standby, standby_memory_note, trial_resources
from searchlab.experiment._spec import ExperimentSpec, check_environment, standby_switch

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASHA_MODEL = ROOT / "tests" / "fixtures" / "asha_model"
HEAD = "SEARCHLAB_STANDBY=auto: "


def _cfg(
    entrypoint: str = "asha_trial:AshaTrial", *, top: Any = None, lr: Any = 0.1, **searcher: Any
) -> Any:
    searcher = {"name": "random", "max_trials": 16, **searcher}
    if searcher["name"] != "random":
        del searcher["max_trials"]
    return load_experiment_config(
        {
            "name": "auto",
            "entrypoint": entrypoint,
            "hyperparameters": {"global_batch_size": 4, "lr": lr},
            "searcher": {"metric": "validation_loss", "max_length": 4, **searcher},
            **(top or {}),
        },
        model_dir=str(ASHA_MODEL),
    )


def _nodes(
    cpus: float, gpus: float, count: int = 1, *, memory_gib: float = 0
) -> list[dict[str, Any]]:
    """Ray's node list; ``memory_gib``: the ``memory`` resource the node declares (0: none)."""
    memory = {"memory": memory_gib * 2**30} if memory_gib else {}
    return [
        {"Alive": True, "Resources": {"CPU": cpus, "GPU": gpus, **memory}} for _ in range(count)
    ]


GRID_OF = {"type": "categorical", "vals": [0.1, 0.2]}  # a grid of two points


def test_two_trials_ready_where_the_cluster_and_the_config_allow() -> None:
    for nodes in (
        _nodes(8, 1),
        _nodes(16, 2),
        _nodes(4, 1, count=2),
        _nodes(8, 1, memory_gib=6),  # 3 trial processes at ~2 GiB
        # A CPU node's memory holds no trial process of a GPU.
        [*_nodes(16, 0, memory_gib=1), *_nodes(16, 2, memory_gib=16)],
    ):
        ready, note = auto_standby(_cfg(), nodes)
        assert ready == 2, note
        assert note == HEAD + "each GPU holds 2 trials ready beside the one training (3 actors)"


@pytest.mark.parametrize(
    ("searcher", "resources", "nodes", "why"),
    [
        (
            {"max_concurrent_trials": 2},
            {},
            _nodes(8, 1),
            "searcher.max_concurrent_trials is 2, fewer than the 3 trials it would run at once "
            "on 1 GPU(s)",
        ),
        (
            {"max_trials": 5},
            {},
            _nodes(16, 2),
            "searcher.max_trials is 5, fewer than the 6 trials it would run at once on 2 GPU(s)",
        ),
        (
            {},
            {"cpus_per_trial": 2},
            _nodes(4, 1),
            "the CPUs of the Ray cluster's GPU nodes hold 2 trials of 2 CPU, fewer than the 3 "
            "it would run at once on 1 GPU(s)",
        ),
        (
            # A CPU-only head node's CPUs cannot run a GPU's actors.
            {},
            {},
            [*_nodes(16, 0), *_nodes(2, 1)],
            "the CPUs of the Ray cluster's GPU nodes hold 2 trials of 1 CPU, fewer than the 3 "
            "it would run at once on 1 GPU(s)",
        ),
        (
            {"name": "grid"},
            {},
            _nodes(8, 1),
            "the grid search has 2 trial(s), fewer than the 3 it would run at once on 1 GPU(s)",
        ),
        (
            {},
            {},
            _nodes(8, 1, memory_gib=5),
            "a GPU node gives Ray's workers 5.0 GiB of memory, less than its 3 trial processes "
            "would hold (~2 GiB each)",
        ),
        (
            {},
            {},
            [*_nodes(32, 2, memory_gib=64), *_nodes(32, 2, memory_gib=10)],  # the second: short
            "a GPU node gives Ray's workers 10.0 GiB of memory, less than its 6 trial processes "
            "would hold (~2 GiB each)",
        ),
    ],
)
def test_one_trial_ready_where_only_two_fit_per_gpu(
    searcher: dict[str, Any], resources: dict[str, Any], nodes: Any, why: str
) -> None:
    cfg = _cfg(top={"resources": resources}, lr=GRID_OF, **searcher)
    ready, note = auto_standby(cfg, nodes)
    assert ready == 1
    assert note == (
        HEAD + "each GPU holds 1 trial ready beside the one training (2 actors), not 2: " + why
    )


def test_an_explicit_count_counts_the_gpu_nodes_cpus_too() -> None:
    # The head node's 16 CPUs cannot run actors beside the worker's GPU, which has 2 CPUs.
    nodes = [*_nodes(16, 0), *_nodes(2, 1)]
    assert trial_resources(_cfg(), nodes, standby=1)["gpu"] == 0.5
    with pytest.raises(ConfigError) as err:
        trial_resources(_cfg(), nodes, standby=2)
    message = str(err.value)
    assert "the CPUs of the Ray cluster's GPU nodes hold 2 trials, fewer than" in message
    assert "SEARCHLAB_STANDBY=2 needs (3 per GPU, 3 for 1 GPU(s))" in message


@pytest.mark.parametrize(
    ("cfg", "nodes", "why"),
    [
        (_cfg(), _nodes(8, 0), "the Ray cluster has no GPUs"),
        (
            _cfg(),
            _nodes(8, 1, memory_gib=3),
            "a GPU node gives Ray's workers 3.0 GiB of memory, less than its 2 trial processes "
            "would hold (~2 GiB each)",
        ),
        (
            _cfg(max_concurrent_trials=1),
            _nodes(8, 1),
            "searcher.max_concurrent_trials is 1, fewer than the 2 trials it would run at once "
            "on 1 GPU(s)",
        ),
        (
            _cfg(top={"resources": {"slots_per_trial": 2}}),
            _nodes(8, 2),
            "resources.slots_per_trial is 2 (standby shares a GPU between trials of one slot "
            "and one whole GPU)",
        ),
        (
            _cfg(top={"resources": {"gpus_per_trial": 0.5}}),
            _nodes(8, 1),
            "resources.gpus_per_trial is 0.5 (standby shares a GPU",
        ),
        (_cfg("python3 train.py"), _nodes(8, 1), "entrypoint is the command 'python3 train.py'"),
        (
            _cfg(name="single"),
            _nodes(8, 1),
            "the single search has 1 trial(s), fewer than the 2 it would run at once on 1 GPU(s)",
        ),
        (
            _cfg(top={"max_restarts": 0}),
            _nodes(8, 1),
            "max_restarts is 0 and standby retries a trial that runs out of GPU memory beside "
            "the others from its checkpoint; set max_restarts to 1 or more to have it",
        ),
    ],
)
def test_off_where_standby_cannot_run_and_the_line_says_why(cfg: Any, nodes: Any, why: str) -> None:
    ready, note = auto_standby(cfg, nodes)
    assert ready == 0
    assert note.startswith(HEAD + "standby is off, as " + why)
    assert "\n" not in note


def test_the_switch_leaves_standby_to_be_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("auto", " AUTO "):
        monkeypatch.setenv("SEARCHLAB_STANDBY", value)
        check_environment()  # accepted before anything is written
        assert standby_switch() == "auto"
    spec = ExperimentSpec.from_config(_cfg(), "s")
    assert spec.standby_auto and spec.standby == 0 and spec.standby_key is None
    decided = spec.with_standby(2)
    assert decided.standby == 2 and decided.standby_key is not None and not decided.train_ahead
    assert decided.standby_auto  # kept, for the lines that name the setting
    # The decided spec reads the switches an explicit count reads: with standby,
    # SEARCHLAB_STANDBY_AHEAD; without, SEARCHLAB_TRAIN_AHEAD.
    monkeypatch.setenv("SEARCHLAB_STANDBY_AHEAD", "1")
    assert spec.with_standby(1).train_ahead
    off = spec.with_standby(0)
    assert off.standby == 0 and off.standby_key is None and not off.train_ahead
    monkeypatch.setenv("SEARCHLAB_TRAIN_AHEAD", "1")
    assert spec.with_standby(0).train_ahead and spec.with_standby(0).standby_key is None
    # Two decisions are two runs: each has its own lock key.
    assert spec.with_standby(2).standby_key != decided.standby_key


def test_a_resumed_experiment_runs_as_it_started_and_auto_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from searchlab.experiment._runner import resumed_standby

    said: list[str] = []
    monkeypatch.setenv("SEARCHLAB_STANDBY", "auto")
    assert resumed_standby({"standby": 2}, said.append) == 2
    assert resumed_standby({"standby": 0}, said.append) == 0
    assert said == [
        "note: " + HEAD + "this experiment resumes as it started (2 trial(s) ready per GPU)",
        "note: " + HEAD + "this experiment resumes as it started (standby off)",
    ]
    said.clear()
    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")  # an explicit count that differs is noted
    assert resumed_standby({"standby": 2}, said.append) == 2 and len(said) == 1


def _single_run(name: str, tmp_path: pathlib.Path) -> tuple[Any, list[str]]:
    """A one-trial search of the fixture's model on the test's Ray, and the lines it printed."""
    lines: list[str] = []
    config = {
        "name": name,
        "entrypoint": "asha_trial:AshaTrial",
        "hyperparameters": {"global_batch_size": 4, "lr": 0.1},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": 2},
    }
    results = searchlab.run(
        config, model_dir=ASHA_MODEL, storage_path=tmp_path / "runs", echo=lines.append
    )
    return results, lines


def test_an_explicit_count_is_told_when_memory_looks_short_and_runs_as_set() -> None:
    nodes = _nodes(8, 1, memory_gib=5)
    assert standby_memory_note(nodes, 2) == (
        "SEARCHLAB_STANDBY=2: a GPU node gives Ray's workers 5.0 GiB of memory, less than its "
        "3 trial processes would hold (~2 GiB each), so the host may run out of memory; "
        "SEARCHLAB_STANDBY=auto holds fewer trials ready where they do not fit"
    )
    assert trial_resources(_cfg(), nodes, standby=2)["gpu"] == 0.3333  # not refused
    assert standby_memory_note(nodes, 1) is None  # 2 processes fit in 5 GiB
    assert standby_memory_note(nodes, 0) is None
    assert standby_memory_note(_nodes(8, 1), 7) is None  # no memory declared: not checked
    # A resumed experiment keeps its count whatever the switch says: no advice to use auto.
    assert standby_memory_note(nodes, 2, resumed=True) == (
        "this experiment keeps the SEARCHLAB_STANDBY=2 it started with, but a GPU node gives "
        "Ray's workers 5.0 GiB of memory, less than its 3 trial processes would hold (~2 GiB "
        "each), so the host may run out of memory"
    )


@pytest.mark.ray
def test_a_run_with_an_explicit_count_prints_the_memory_note(
    ray_session: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from searchlab.experiment import _resources

    asked: list[tuple[int, bool]] = []

    def note(nodes: Any, standby: int, *, resumed: bool = False) -> str:
        asked.append((standby, resumed))
        return f"memory looks short for {standby}"

    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")  # a CPU cluster: trials run as without
    monkeypatch.setattr(_resources, "standby_memory_note", note)
    results, lines = _single_run("explicit-memory", tmp_path)
    assert results.trials["state"].tolist() == ["COMPLETED"]
    assert asked == [(1, False)]
    assert "note: memory looks short for 1" in lines


@pytest.mark.ray
def test_auto_changes_nothing_on_a_cpu_cluster(
    ray_session: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEARCHLAB_STANDBY", "auto")
    results, lines = _single_run("auto-cpu", tmp_path)
    assert results.trials["state"].tolist() == ["COMPLETED"]
    assert "note: " + HEAD + "standby is off, as the Ray cluster has no GPUs" in lines
    meta = json.loads((results.experiment_dir / "experiment.json").read_text())
    assert meta["standby"] == 0


@pytest.mark.ray
def test_the_decision_is_recorded_before_the_first_trial(
    ray_session: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``experiment.json`` holds what auto decided by the time a trial builds (a resume runs
    with it): here a decision of one ready, which on this CPU cluster changes no trial."""
    from searchlab.experiment import _resources

    monkeypatch.setenv("SEARCHLAB_STANDBY", "auto")
    monkeypatch.setattr(_resources, "auto_standby", lambda cfg, nodes: (1, "decided: 1"))
    lines: list[str] = []
    config = {
        "name": "auto-record",
        "entrypoint": "recording_trial:RecordingTrial",
        "hyperparameters": {
            "global_batch_size": 4,
            "lr": 0.1,
            "experiment_file": str(tmp_path / "runs" / "auto-record" / "experiment.json"),
        },
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": 2},
    }
    model = asha_model_dir(tmp_path, recording_trial=RECORDING_TRIAL)
    results = searchlab.run(
        config, model_dir=model, storage_path=tmp_path / "runs", echo=lines.append
    )
    assert results.trials["state"].tolist() == ["COMPLETED"]
    assert "note: decided: 1" in lines
    meta = json.loads((results.experiment_dir / "experiment.json").read_text())
    assert meta["standby"] == 1
    assert results.experiment_dir == tmp_path / "runs" / "auto-record"
    seen = json.loads((tmp_path / "runs" / "seen_at_build.json").read_text())
    assert seen["standby"] == 1  # as the trial's build found it


# A trial that copies experiment.json's standby, as it is when the trial builds, beside it.
RECORDING_TRIAL = """
import json, pathlib
from asha_trial import AshaTrial


class RecordingTrial(AshaTrial):
    def __init__(self, context):
        super().__init__(context)
        path = pathlib.Path(context.get_hparams()["experiment_file"])
        seen = json.loads(path.read_text())["standby"]
        (path.parent.parent / "seen_at_build.json").write_text(json.dumps({"standby": seen}))
"""


SEARCH = """
import json, pathlib, sys
import ray
import searchlab
from searchlab._ray_env import ray_init_kwargs
from searchlab.experiment._compat import keep_prestarted_workers

out = pathlib.Path(sys.argv[1])
# 8 GiB of memory for Ray's workers, whatever the machine has: 3 trial processes fit.
ray.init(num_cpus=3, num_gpus=1, _memory=8 * 2**30, _system_config=keep_prestarted_workers(),
         **ray_init_kwargs())
lines = []
config = {
    "name": "auto-gpu",
    "entrypoint": "asha_trial:AshaTrial",
    "hyperparameters": {
        "global_batch_size": 4,
        "lr": {"type": "categorical", "vals": [0.001, 0.01, 0.1, 0.3, 0.5, 1.0]},
        "batch_log": str(out / "batches.log"),
        "batch_sleep": 0.2,
    },
    "searcher": {"name": "grid", "metric": "validation_loss", "max_length": {"batches": 8}},
    "scheduling_unit": 2,
    "reproducibility": {"experiment_seed": 3},
}
results = searchlab.run(config, model_dir=sys.argv[2], storage_path=str(out / "runs"),
                        echo=lines.append)
meta = json.loads((results.experiment_dir / "experiment.json").read_text())
json.dump(
    {
        "states": sorted(results.trials["state"]),
        "notes": [line for line in lines if line.startswith("note: SEARCHLAB_STANDBY")],
        "standby": meta["standby"],
    },
    open(out / "result.json", "w"),
)
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600 + 60)
def test_auto_runs_three_actors_on_a_gpu_and_records_it(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "search.py"
    script.write_text(SEARCH)
    run_search_script(script, tmp_path, asha_model_dir(tmp_path), standby="auto")
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["states"] == ["COMPLETED"] * 6
    assert result["notes"] == [
        "note: " + HEAD + "each GPU holds 2 trials ready beside the one training (3 actors)"
    ]
    assert result["standby"] == 2  # what a resume runs with
    # Trials shared the one GPU: without standby, one whole-GPU trial at a time runs on one
    # actor that Tune reuses; with it, up to three actors train, taking turns.
    pids = collections.Counter(
        line.split()[0] for line in (tmp_path / "batches.log").read_text().splitlines()
    )
    assert 2 <= len(pids) <= 3, pids


def test_a_resume_that_cannot_run_its_standby_says_what_to_do_instead() -> None:
    # Started with two trials ready on one GPU; the cluster it resumes on has two GPUs,
    # and six trials at once are more than the search's limit of four.
    cfg = _cfg(max_concurrent_trials=4)
    assert trial_resources(cfg, _nodes(8, 1), standby=2, resumed=True)["gpu"] == 0.3333
    with pytest.raises(ConfigError) as err:
        trial_resources(cfg, _nodes(8, 2), standby=2, resumed=True)
    message = str(err.value)
    assert "\n" not in message and "unset SEARCHLAB_STANDBY or" not in message
    assert "this experiment started with SEARCHLAB_STANDBY=2, which its trials keep" in message
    assert "searcher.max_concurrent_trials is 4, fewer than the 6 trials" in message
    assert message.endswith("(searchlab resume --force-restart with SEARCHLAB_STANDBY unset)")
