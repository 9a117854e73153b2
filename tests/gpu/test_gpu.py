"""On a CUDA GPU: searches place trials on the GPU, pack four on one, and train under AMP.

Skipped without CUDA. The Ray tests share the session's Ray instance (``ray_session``:
``ray.init(num_cpus=2)``); Ray detects GPUs itself when ``num_gpus`` is not given (NVML,
limited by ``CUDA_VISIBLE_DEVICES``), which the first test checks. The trial is
``tests/fixtures/gpu_model/gpu_model_def.py:GpuProbeTrial``.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import searchlab  # noqa: E402
from searchlab import pytorch  # noqa: E402
from searchlab.pytorch import Batch  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GPU_MODEL = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "gpu_model"


def _config(name: str, hparams: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": name,
        "entrypoint": "gpu_model_def:GpuProbeTrial",
        "hyperparameters": {"global_batch_size": 8, **hparams},
        "searcher": {
            "name": "grid",
            "metric": "validation_loss",
            "max_length": {"batches": 6},
        },
        "scheduling_unit": 2,
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 1},
    }
    config.update(overrides)
    return config


def _search(config: dict[str, Any], tmp_path: pathlib.Path) -> searchlab.Results:
    lines: list[str] = []
    try:
        return searchlab.run(
            config, model_dir=GPU_MODEL, storage_path=tmp_path / "runs", echo=lines.append
        )
    finally:
        print("\n".join(lines))  # shown by pytest when the test fails


@pytest.mark.ray
def test_search_on_one_gpu_trains_every_trial_on_cuda(ray_session, tmp_path) -> None:
    assert ray_session.cluster_resources().get("GPU", 0) >= 1, "Ray did not detect the GPU"
    config = _config("gpu-grid", {"hidden": {"type": "categorical", "vals": [8, 16]}})

    results = _search(config, tmp_path)

    trials = results.trials
    assert sorted(trials["hidden"]) == [8, 16]
    assert trials["state"].tolist() == ["COMPLETED", "COMPLETED"]
    assert trials["batches"].tolist() == [6, 6]
    assert trials["best_validation_loss"].notna().all()
    for checkpoint in trials["checkpoint"]:
        assert (pathlib.Path(checkpoint) / "state-dict.pth").is_file()
    metrics = results.metrics
    for trial_id in trials["trial_id"]:
        own = metrics[metrics["trial_id"] == trial_id]
        training = own[own["group"] == "training"]
        assert training["batches"].tolist() == [2, 4, 6]
        assert (own[own["group"] == "validation"]["batches"] == 6).all()
        assert (own["on_cuda"] == 1.0).all()  # training and validation, every report


@pytest.mark.ray
def test_four_trials_at_a_quarter_gpu_each_train_at_the_same_time(ray_session, tmp_path) -> None:
    records = tmp_path / "records"
    config = _config(
        "gpu-packed",
        {
            "replica": {"type": "categorical", "vals": [0, 1, 2, 3]},
            "record_dir": str(records),
            "barrier": 4,
        },
        resources={"gpus_per_trial": 0.25, "cpus_per_trial": 0.5},
    )
    config["searcher"]["max_concurrent_trials"] = 4

    results = _search(config, tmp_path)

    assert results.trials["state"].tolist() == ["COMPLETED"] * 4
    assert results.trials["batches"].tolist() == [6] * 4
    seen = [json.loads(p.read_text()) for p in sorted(records.glob("trial-*.json"))]
    assert sorted(r["trial_id"] for r in seen) == sorted(results.trials["trial_id"])
    # Each trial waited at its first batch until all four were there: only concurrent
    # trials get past that barrier with 4 peers (otherwise it times out with fewer).
    assert [r["peers"] for r in seen] == [4, 4, 4, 4]
    assert max(r["arrived"] for r in seen) < min(r["finished"] for r in seen)
    assert len({r["pid"] for r in seen}) == 4
    assert all(r["device"].startswith("cuda") for r in seen)
    if ray_session.cluster_resources().get("GPU", 0) == 1:
        assert len({r["cuda_visible_devices"] for r in seen}) == 1  # one GPU, shared
    training = results.metrics[results.metrics["group"] == "training"]
    assert (training["on_cuda"] == 1.0).all()
    assert (training["peers"] == 4).all()


@pytest.mark.ray
@pytest.mark.parametrize(
    ("memory", "rule"),
    [
        # Batches that each take 40% of the GPU's memory: kept in three actors' allocator
        # caches, the third would not fit; caches go back at each turn's end (rules 1, 2).
        ({"ballast": 0.4}, "cache"),
        # Trials that each hold 35% from build to end: no cache to give back helps; the GPU
        # must end up crowded, trials built in the turn and parked at its end (rule 3),
        # after out-of-memory retries. Each lasts ~3 s, longer than the other actors take to
        # start: without the sleep, the six trials ran one after another within 2 s (call
        # 17A, H200) and never held their memory at once.
        ({"resident": 0.35, "batch_sleep_s": 0.5}, "crowded"),
    ],
)
def test_standby_trials_that_fit_the_gpu_alone_all_complete(
    ray_session, tmp_path, monkeypatch, memory, rule
) -> None:
    monkeypatch.setenv("SEARCHLAB_STANDBY", "2")  # three actors per GPU
    config = _config(
        f"gpu-standby-{rule}",
        {"replica": {"type": "categorical", "vals": list(range(6))}, **memory},
        resources={"cpus_per_trial": 0.5},
        max_restarts=8,
    )
    config["searcher"]["max_concurrent_trials"] = 3 * int(
        ray_session.cluster_resources().get("GPU", 1)
    )

    results = _search(config, tmp_path)

    trials = results.trials
    assert trials["state"].tolist() == ["COMPLETED"] * 6, trials[["error", "restarts"]]
    assert trials["batches"].tolist() == [6] * 6
    training = results.metrics[results.metrics["group"] == "training"]
    assert (training["on_cuda"] == 1.0).all()
    if rule == "crowded":
        assert trials["restarts"].sum() >= 1  # it did run out of memory: the rule was tested
    print(rule, "restarts:", trials["restarts"].tolist())  # out-of-memory retries


@pytest.mark.ray
def test_auto_standby_holds_trials_ready_on_each_gpu(ray_session, tmp_path, monkeypatch) -> None:
    """``SEARCHLAB_STANDBY=auto`` on a GPU: trials ready beside each GPU's training one (two
    where the session's CPUs allow), said in one line, recorded for a resume, all on CUDA."""
    monkeypatch.setenv("SEARCHLAB_STANDBY", "auto")
    # Not the host's memory (auto's check of it has CPU tests): any GPU box may run this.
    monkeypatch.setattr("searchlab.experiment._resources.TRIAL_PROCESS_BYTES", 1)
    config = _config(
        "gpu-standby-auto",
        {"replica": {"type": "categorical", "vals": list(range(6))}, "batch_sleep_s": 0.2},
        resources={"cpus_per_trial": 0.5},
        max_restarts=2,
    )
    lines: list[str] = []
    try:
        results = searchlab.run(
            config, model_dir=GPU_MODEL, storage_path=tmp_path / "runs", echo=lines.append
        )
    finally:
        print("\n".join(lines))
    ready = json.loads((results.experiment_dir / "experiment.json").read_text())["standby"]
    assert ready >= 1
    notes = [line for line in lines if line.startswith("note: SEARCHLAB_STANDBY=auto")]
    assert len(notes) == 1 and f"each GPU holds {ready} trial" in notes[0], notes
    assert results.trials["state"].tolist() == ["COMPLETED"] * 6
    assert (results.metrics["on_cuda"].dropna() == 1.0).all()


@pytest.mark.ray
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_run_that_starts_ray_trains_two_trials_on_two_gpus(tmp_path) -> None:
    """``searchlab run`` starting its own Ray: the trials' actors start in workers Ray
    started (and that imported torch) before Ray assigned them a GPU, and each still trains
    on the GPU Ray gave it."""
    import os
    import subprocess
    import sys

    import yaml

    records = tmp_path / "records"
    config = _config(
        "two-gpus",
        {"replica": {"type": "categorical", "vals": [0, 1]}, "record_dir": str(records)},
        resources={"slots_per_trial": 1},
    )
    config["hyperparameters"]["barrier"] = 2  # both trials at once, one on each GPU
    config_file = tmp_path / "two.yaml"
    config_file.write_text(yaml.safe_dump(config))
    args = ["run", str(config_file), str(GPU_MODEL), "--storage-path", str(tmp_path / "runs")]
    proc = subprocess.run(
        [sys.executable, "-m", "searchlab.cli", *args],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = [json.loads(p.read_text()) for p in sorted(records.glob("trial-*.json"))]
    assert len(seen) == 2 and [r["peers"] for r in seen] == [2, 2]
    assert len({r["cuda_visible_devices"] for r in seen}) == 2
    assert len({r["gpu_uuid"] for r in seen}) == 2  # two physical GPUs, not one twice
    assert "ffffffff" in {r["worker_job"] for r in seen}  # a worker Ray started beforehand


def _fit(
    directory: pathlib.Path, hparams: dict[str, Any], batches: int, latest: str | None = None
) -> tuple[Any, pytorch.Trainer, str]:
    from gpu_model.gpu_model_def import GpuProbeTrial

    with pytorch.init(
        hparams={"global_batch_size": 8, **hparams},
        checkpoint_dir=directory,
        seed=3,
        enable_tensorboard_logging=False,
    ) as ctx:
        assert ctx.device.type == "cuda"
        trial = GpuProbeTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        path = trainer.fit(max_length=Batch(batches), latest_checkpoint=latest)
    assert path is not None
    return trial, trainer, path


def _training_metrics(trainer: pytorch.Trainer) -> dict[str, float]:
    (report,) = [r for r in trainer.reports if r.group == "training"]
    return report.metrics


def _saved_scalers(path: str) -> list[dict[str, Any]]:
    state = torch.load(f"{path}/state-dict.pth", map_location="cpu", weights_only=False)
    return state["scaler_state_dict"]


@pytest.mark.skipif(
    torch.cuda.is_available() and not torch.cuda.is_bf16_supported(), reason="GPU lacks bf16"
)
def test_use_amp_trains_under_bf16_autocast_on_cuda(tmp_path) -> None:
    trial, trainer, path = _fit(tmp_path, {"amp": True}, batches=4)

    metrics = _training_metrics(trainer)
    assert metrics["on_cuda"] == 1.0
    assert metrics["act_bf16"] == 1.0  # every batch: the mean over the window
    assert not torch.is_autocast_enabled("cuda")  # only inside the trial's calls
    assert _saved_scalers(path) == []  # bf16 needs no loss scaling
    assert trial.model[0].weight.dtype == torch.float32  # fp32 master weights


def test_use_amp_without_bf16_uses_fp16_and_checkpoints_its_scaler(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)

    _, trainer, path = _fit(tmp_path, {"amp": True}, batches=4)

    metrics = _training_metrics(trainer)
    assert metrics["act_fp16"] == 1.0
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    (scaler,) = _saved_scalers(path)  # the automatic GradScaler, saved with the checkpoint
    assert 0 < scaler["scale"] <= 2.0**16  # its default start; halved on any overflow


def test_wrapped_cuda_grad_scaler_resumes_from_its_checkpoint(tmp_path) -> None:
    hp = {"fp16_scaler": True, "init_scale": 1024.0}
    whole, _, _ = _fit(tmp_path / "whole", hp, batches=6)
    first, _, path = _fit(tmp_path / "first", hp, batches=3)
    (scaler,) = _saved_scalers(path)
    assert scaler["scale"] == 8192.0  # doubled after each of 3 finite steps

    second, trainer, _ = _fit(tmp_path / "second", hp, batches=6, latest=path)

    assert second.scales[0] == 8192.0  # restored before training went on
    assert first.scales + second.scales == whole.scales == [1024.0 * 2**k for k in range(6)]
    assert _training_metrics(trainer)["act_fp16"] == 1.0
    for resumed, uninterrupted in zip(second.model.parameters(), whole.model.parameters()):
        assert torch.equal(resumed, uninterrupted)


def test_a_parked_trial_holds_no_gpu_memory_and_trains_on(tmp_path) -> None:
    """What a paused trial's idle actor does (``IdleRelease``): nothing left on the GPU."""
    from searchlab.config import load_experiment_config
    from searchlab.experiment._idle import free_accelerator_memory
    from searchlab.experiment._protocol import TrialConfig
    from searchlab.experiment._spec import ExperimentSpec
    from searchlab.experiment._trial_runner import TrialRunner

    hparams = {"global_batch_size": 8, "hidden": 4096, "amp": True}
    loaded = load_experiment_config(_config("park", hparams), model_dir=str(GPU_MODEL))
    spec = ExperimentSpec.from_config(loaded, "park")
    free_accelerator_memory()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    runner = TrialRunner(
        spec,
        TrialConfig(hparams, rung_ends=[2, 6], trial_seed=3).to_tune(),
        trial_id="park",
        logdir=str(tmp_path),
        model_dir=str(GPU_MODEL),
    )
    first = runner.step()
    assert first["on_cuda"] == 1.0
    assert torch.cuda.memory_allocated() > allocated  # the trial's weights and optimizer

    runner.state()
    runner.park()
    free_accelerator_memory()

    assert runner.parked
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() == reserved
    # Rebuilt from the kept state: first the rung's validation that was due at batch 2,
    # then training goes on, on the GPU again.
    second = runner.step()
    assert second["group"] == "validation" and second["batches"] == first["batches"] == 2
    third = runner.step()
    assert third["on_cuda"] == 1.0 and third["batches"] == 4


def test_host_copy_of_cuda_state_is_pinned_equal_and_independent() -> None:
    """A rung end's host copy: pinned buffers filled by asynchronous copies, complete when
    ``host_copy`` returns, with the same values and memory layout, sharing nothing."""
    from searchlab.experiment._checkpoint_writer import host_copy

    model = torch.nn.Conv2d(3, 8, 3).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3, 8, 8, device="cuda")).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}
    copied = host_copy(state)
    weight = copied["model"]["weight"]
    assert weight.device.type == "cpu" and weight.is_pinned()
    assert weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(weight, model.weight.detach().cpu())
    momentum = copied["optimizer"]["state"][0]["momentum_buffer"]
    assert momentum.is_pinned() and torch.equal(
        momentum, optimizer.state[model.weight]["momentum_buffer"].cpu()
    )
    with torch.no_grad():
        model.weight.add_(1.0)
    torch.cuda.synchronize()
    assert not torch.equal(weight, model.weight.detach().cpu())  # training on leaves it alone
    assert copied["step"] == 1 and copied["model"] is not state["model"]


def test_an_idle_release_gives_cached_pinned_blocks_back_and_keeps_live_states() -> None:
    """Host copies are pinned, and torch's host allocator caches freed pinned blocks for the
    process's life: an idle trial's release hands those back, while a state still kept for a
    resume from memory stays pinned and intact."""
    from searchlab.experiment._checkpoint_writer import host_copy
    from searchlab.experiment._idle import free_accelerator_memory

    if getattr(torch.accelerator, "empty_host_cache", None) is None and not hasattr(
        torch._C, "_host_emptyCache"
    ):
        pytest.skip(f"torch {torch.__version__} cannot empty its pinned host cache")
    kept = host_copy({"w": torch.randn(1 << 20, device="cuda")})
    dropped = host_copy({"w": torch.randn(1 << 22, device="cuda")})
    expected = kept["w"].clone()
    del dropped  # its pinned block goes back to torch's cache, still page-locked
    before = torch.cuda.host_memory_stats()["allocated_bytes.current"]
    assert before >= (1 << 22) * 4 + (1 << 20) * 4
    free_accelerator_memory()
    after = torch.cuda.host_memory_stats()["allocated_bytes.current"]
    assert before - after >= (1 << 22) * 4
    assert after >= (1 << 20) * 4 and kept["w"].is_pinned()
    assert torch.equal(kept["w"], expected)


def test_a_kept_state_leaves_its_pinned_buffers_to_the_next_save(tmp_path) -> None:
    """Once written, a state kept for a resume from memory is pageable: its pinned buffers go
    back to torch's cache, so the next save of the same shapes page-locks nothing new (with
    kept states pinned, every save of a worker holding several trials' states did)."""
    from searchlab.experiment._checkpoint_writer import CheckpointWriter

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10)).cuda()
    writer = CheckpointWriter(thread=True)

    def save(i: int) -> pathlib.Path:
        staging, final = tmp_path / f"s{i}", tmp_path / "t" / f"checkpoint_{i:06d}"
        staging.mkdir()
        writer.stage(str(staging), {"model": model.state_dict()}, {"batches_trained": i})
        final.mkdir(parents=True)
        for f in staging.iterdir():  # Tune's copy
            (final / f.name).write_bytes(f.read_bytes())
        writer.start(str(final))
        writer.flush()
        return final

    first = save(0)
    allocs = torch.cuda.host_memory_stats()["num_host_alloc"]
    second = save(1)
    assert torch.cuda.host_memory_stats()["num_host_alloc"] == allocs  # the cache served it
    kept = writer.take(str(first))
    assert kept is not None and not kept["model"]["0.weight"].is_pinned()
    assert torch.equal(kept["model"]["0.weight"], model[0].weight.detach().cpu())
    assert writer.take(str(second)) is not None
    writer.close()
