"""TrialRecorder without Ray running: trials.json's write cadence and per-trial retention.

Tune's ``Trial`` objects are stood in for by namespaces with the attributes the recorder reads.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import types
from typing import Any

import pytest

from searchlab.experiment import _recorder
from searchlab.experiment._protocol import TrialConfig
from searchlab.experiment._recorder import TrialRecorder
from searchlab.experiment._records import error_line, gpu_sharing_hint, retry_line
from searchlab.experiment._spec import ExperimentSpec

SPEC = ExperimentSpec(
    name="recorder",
    exp_conf={},
    entrypoint="model_def:Trial",
    model_dir=".",
    module_file="model_def.py",
    metric="validation_loss",
    smaller_is_better=True,
    length_unit="batches",
    max_length=8,
    scheduling_unit=1,
    validation_period=None,
    checkpoint_period=None,
    checkpoint_policy="best",
    perform_initial_validation=False,
    aggregation_frequency=1,
    environment_variables={},
)


def _trial(trial_id: str, lr: float) -> Any:
    config = TrialConfig({"lr": lr}, rung_ends=[4, 8], bracket=0, trial_seed=1).to_tune()
    return types.SimpleNamespace(
        trial_id=trial_id, status="RUNNING", config=config, checkpoint=None, error_file=None
    )


def _recorder_in(tmp_path: pathlib.Path) -> TrialRecorder:
    control = types.SimpleNamespace(
        restore_failed=False, interrupted=False, disk_full=set(), fatal=False
    )
    return TrialRecorder(SPEC, tmp_path, echo=lambda line: None, control=control)


def _on_disk(tmp_path: pathlib.Path) -> dict[str, dict[str, Any]]:
    data = json.loads((tmp_path / "trials.json").read_text())
    return {rec["trial_id"]: rec for rec in data["trials"]}


def _validation(batches: int, value: float) -> dict[str, Any]:
    return {"group": "validation", "batches": batches, "validation_loss": value}


def test_a_slow_trials_json_is_rewritten_less_often_but_never_lags_behind_tunes_save(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(_recorder.time, "monotonic", lambda: clock[0])
    real_write = _recorder.atomic_write

    def slow_write(path: pathlib.Path, text: str) -> None:
        real_write(path, text)
        clock[0] += 1.0  # a write of every trial's record takes a second (a slow disk)

    monkeypatch.setattr(_recorder, "atomic_write", slow_write)
    recorder = _recorder_in(tmp_path)
    a = _trial("a", 0.1)
    recorder.on_trial_result(0, [a], a, _validation(4, 0.5))
    recorder.on_step_end(0, [a])
    assert _on_disk(tmp_path)["a"]["best_metric"] == 0.5

    # Within 20 write-costs of the last write, a step leaves the file as it is ...
    recorder.on_trial_result(1, [a], a, _validation(8, 0.25))
    clock[0] += 5.0
    recorder.on_step_end(1, [a])
    assert _on_disk(tmp_path)["a"]["best_metric"] == 0.5
    # ... but Tune's save (and the snapshot written with it) always finds it current.
    recorder.get_state()
    assert _on_disk(tmp_path)["a"]["best_metric"] == 0.25
    assert _on_disk(tmp_path)["a"]["batches"] == 8

    b = _trial("b", 0.2)
    recorder.on_trial_result(2, [a, b], b, _validation(4, 0.75))
    clock[0] += 20.0  # paid back: the next step writes again
    recorder.on_step_end(2, [a, b])
    assert set(_on_disk(tmp_path)) == {"a", "b"}


def _checkpoint(tmp_path: pathlib.Path, trial_id: str, index: int, batches: int) -> Any:
    path = tmp_path / trial_id / f"checkpoint_{index:06d}"
    path.mkdir(parents=True)
    (path / "state-dict.pth").write_bytes(b"state")
    (path / "metadata.json").write_text(json.dumps({"batches_trained": batches}))
    return types.SimpleNamespace(path=str(path))


def test_a_new_checkpoint_lets_go_of_its_own_trials_older_one_only(
    tmp_path: pathlib.Path,
) -> None:
    recorder = _recorder_in(tmp_path)  # keeps each trial's latest and best checkpoint
    a, b = _trial("a", 0.1), _trial("b", 0.2)
    for trial, values in ((a, (0.5, 0.7, 0.6)), (b, (0.9,))):
        for i, value in enumerate(values):
            batches = 4 * (i + 1)
            recorder.on_trial_result(i, [a, b], trial, _validation(batches, value))
            ckpt = _checkpoint(tmp_path, trial.trial_id, i, batches)
            recorder.on_checkpoint(i, [a, b], trial, ckpt)
    # a's second checkpoint is neither its best (the first) nor its latest (the third).
    assert recorder._deletions.queued == ["a/checkpoint_000001"]
    kept = [c["path"] for c in recorder.records["a"]["saved_checkpoints"]]
    assert kept == ["a/checkpoint_000000", "a/checkpoint_000002"]
    assert recorder.records["a"]["checkpoint"] == "a/checkpoint_000000"
    assert [c["path"] for c in recorder.records["b"]["saved_checkpoints"]] == [
        "b/checkpoint_000000"
    ]


def test_a_checkpoint_let_go_stays_until_a_snapshot_no_longer_names_it(
    tmp_path: pathlib.Path,
) -> None:
    """A resumed trial restores from c0, which the dead driver had let go; once c1 replaces it,
    c0 is deleted only after a snapshot written since then (the one on disk names c0)."""
    spec = dataclasses.replace(
        SPEC, exp_conf={"checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0}}
    )
    snapshots = types.SimpleNamespace(generation=3, error=None, write=lambda: None)
    control = types.SimpleNamespace(
        restore_failed=False, interrupted=False, disk_full=set(), fatal=False
    )
    recorder = TrialRecorder(
        spec, tmp_path, echo=lambda line: None, control=control, snapshots=snapshots
    )
    a = _trial("a", 0.1)
    c0 = _checkpoint(tmp_path, "a", 0, 4)
    recorder.on_checkpoint(0, [a], a, c0)
    recorder._deletions.let_go("a/checkpoint_000000", "a", generation=0)  # from trials.json
    recorder.on_step_end(0, [a])
    assert pathlib.Path(c0.path).is_dir()  # Tune's latest for the trial: kept

    recorder.on_checkpoint(1, [a], a, _checkpoint(tmp_path, "a", 1, 8))
    recorder.on_step_end(1, [a])
    assert pathlib.Path(c0.path).is_dir()  # snapshot 3, on disk, still names it
    snapshots.generation = 4  # Tune saved again: the snapshot names checkpoint_000001
    recorder.on_step_end(2, [a])
    assert not pathlib.Path(c0.path).exists()
    assert recorder._deletions.queued == []


def test_trials_json_holds_one_trial_per_line_and_ended_trials_stay_as_recorded(
    tmp_path: pathlib.Path,
) -> None:
    recorder = _recorder_in(tmp_path)
    a, b = _trial("a", 0.1), _trial("b", 0.2)
    recorder.on_trial_result(0, [a, b], a, _validation(4, 0.5))
    a.status = "TERMINATED"
    recorder.on_step_end(0, [a, b])
    recorder.write()
    text = (tmp_path / "trials.json").read_text()
    data = json.loads(text)
    assert data["format_version"] == 2 and data["pending_deletions"] == []
    assert {r["trial_id"]: r["state"] for r in data["trials"]} == {"a": "COMPLETED", "b": "RUNNING"}
    assert not any(k.startswith("_") for r in data["trials"] for k in r)  # private fields stay
    trial_lines = [line for line in text.splitlines() if line.startswith('{"trial_id"')]
    assert [json.loads(line.rstrip(","))["trial_id"] for line in trial_lines] == ["a", "b"]
    # An ended trial keeps its recorded state whatever Tune says of it later (a resumed run
    # stops the ended trials it brought back), with or without the step's fast path.
    a.status = "ERROR"
    recorder.on_step_end(1, [a, b])
    recorder.write()
    assert _on_disk(tmp_path)["a"]["state"] == "COMPLETED"


_OOM = (
    "Traceback (most recent call last):\n  ...\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 79.10 GiB of which 1.19 GiB is free.\n"
)


def test_a_trial_out_of_gpu_memory_on_a_shared_gpu_is_told_what_shares_it() -> None:
    standby = dataclasses.replace(SPEC, standby_key="k1", standby_ready=2)
    hint = gpu_sharing_hint(_OOM, standby)
    assert "3 trial actors share each GPU with SEARCHLAB_STANDBY=2" in hint
    assert "new experiment without SEARCHLAB_STANDBY" in hint
    packed = dataclasses.replace(SPEC, exp_conf={"resources": {"gpus_per_trial": 0.25}})
    assert "gpus_per_trial: 0.25 packs 4 trials on each GPU" in gpu_sharing_hint(_OOM, packed)
    # Nothing to say: a GPU of its own, a whole GPU asked for, or another error.
    assert gpu_sharing_hint(_OOM, SPEC) == ""
    whole = dataclasses.replace(SPEC, exp_conf={"resources": {"gpus_per_trial": 1}})
    assert gpu_sharing_hint(_OOM, whole) == ""
    assert gpu_sharing_hint("ValueError: bad lr\n", standby) == ""
    assert gpu_sharing_hint("Traceback ...\nMemoryError\n", standby) == ""  # the host's
    # A library's allocation on the GPU that failed is the same trouble.
    cublas = "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate\n"
    assert gpu_sharing_hint(cublas, standby) == hint
    assert error_line("Traceback ...\nValueError: bad lr\n", standby) == "ValueError: bad lr"
    assert error_line("", SPEC) == "unknown error"


def _echoing_recorder(spec: Any, tmp_path: pathlib.Path, lines: list[str]) -> TrialRecorder:
    """A recorder of a run that is going on, its lines appended to ``lines``."""
    control = types.SimpleNamespace(
        restore_failed=False, interrupted=False, disk_full=set(), fatal=False
    )
    return TrialRecorder(spec, tmp_path, echo=lines.append, control=control)


def test_an_errored_trial_s_line_ends_with_the_gpu_sharing_hint(tmp_path: pathlib.Path) -> None:
    lines: list[str] = []
    spec = dataclasses.replace(SPEC, standby_key="k1", standby_ready=1)
    recorder = _echoing_recorder(spec, tmp_path, lines)
    a = _trial("a", 0.1)
    (tmp_path / "error.txt").write_text(_OOM)
    a.error_file = str(tmp_path / "error.txt")
    recorder.on_step_end(0, [a])
    a.status = "ERROR"
    recorder.on_trial_error(1, [a], a)
    recorder.on_step_end(1, [a])
    (line,) = [line for line in lines if "errored" in line]
    assert "errored: torch.OutOfMemoryError: CUDA out of memory." in line
    assert line.endswith(
        "run the search as a new experiment without SEARCHLAB_STANDBY, or with a smaller count)"
    )
    assert "2 trial actors share each GPU with SEARCHLAB_STANDBY=1" in line


def test_a_retried_trial_s_line_says_why_it_failed(tmp_path: pathlib.Path) -> None:
    lines: list[str] = []
    standby = dataclasses.replace(SPEC, standby_key="k1", standby_ready=2)
    recorder = _echoing_recorder(standby, tmp_path, lines)
    a = _trial("a", 0.1)
    recorder.on_step_end(0, [a])
    (tmp_path / "error.txt").write_text(_OOM)
    a.error_file = str(tmp_path / "error.txt")
    recorder.on_trial_recover(1, [a], a)
    (line,) = [line for line in lines if "failed" in line]
    assert "trial a failed; retry 1 from its latest checkpoint: torch.OutOfMemoryError" in line
    assert line.endswith("parks trials between turns if that is not enough)")
    # Another error, or a GPU not shared by standby: the cause alone.
    other = "Traceback ...\nValueError: bad lr\n"
    assert retry_line(other, 2, standby) == (
        "failed; retry 2 from its latest checkpoint: ValueError: bad lr"
    )
    assert retry_line(_OOM, 1, SPEC).endswith(
        "GPU 0 has a total capacity of 79.10 GiB of which 1.19 GiB is free."
    )
    assert retry_line("", 1, SPEC).endswith("checkpoint: unknown error")
    cudnn = "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED\n"
    assert retry_line(cudnn, 1, standby).endswith("if that is not enough)")
