"""Ray Tune's BOHB (``HyperBandForBOHB`` + ``TuneBOHB``) in a real Tune run (``search_efficiency``).

HyperBandForBOHB pauses and resumes trials through Tune's controller, so it runs in a real
``Tuner.fit`` rather than in the simulated runner: ``workers`` trials at once (Ray started with
that many logical CPUs), a class ``Trainable`` whose ``step`` trains units of the problem's
curve (instant for the synthetic family, one real epoch for digits) up to the next length
where a Hyperband bracket decides (the result lists every unit's validation error, so the
budget and the incumbent see each unit, as in the other runs), and checkpoints that hold
the unit reached (and, for digits, the model, optimizer and shuffling state), so a resumed trial
repeats nothing. Every result reaching the driver is counted as one unit of budget, in arrival
order; a ``Stopper`` ends the run once ``budget`` units are in. The searcher sees each result
with Hyperband's ``budget``, as in any BOHB run.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import tempfile
from typing import Any

from _mf_problems import make_problem
from _mf_sim import Report, RunResult

__all__ = ["run_ray_bohb"]

HERE = pathlib.Path(__file__).resolve().parent


def _trainable_class() -> Any:
    from ray import tune

    class CurveTrainable(tune.Trainable):
        """One trial: each ``step`` trains to the next Hyperband milestone."""

        def setup(self, config: dict[str, Any]) -> None:
            self._start(config)

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            self._start(new_config)
            return True

        def _start(self, config: dict[str, Any]) -> None:
            params = dict(config)
            self.problem_name = params.pop("__problem")
            self.seed = int(params.pop("__seed"))
            eta = float(params.pop("__eta"))
            problem = _problem(self.problem_name)
            self.curve = problem.curve(params, self.seed)
            self.max_length = problem.max_length
            self.milestones = hyperband_milestones(self.max_length, eta)
            self.t = 0

        def step(self) -> dict[str, Any]:
            # Train to the next length where any Hyperband bracket decides; report each unit.
            end = next(m for m in self.milestones if m > self.t)
            units = []
            while self.t < end:
                self.t += 1
                units.append(
                    (self.t, float(self.curve.observe(self.t)), float(self.curve.true(self.t)))
                )
            return {
                "val_error": units[-1][1],
                "unit": self.t,
                "units": units,
                "done": self.t >= self.max_length,
            }

        def save_checkpoint(self, checkpoint_dir: str) -> None:
            path = pathlib.Path(checkpoint_dir)
            (path / "unit.json").write_text(json.dumps({"t": self.t}))
            if hasattr(self.curve, "model"):
                import torch

                state = {
                    "model": self.curve.model.state_dict(),
                    "opt": self.curve.opt.state_dict(),
                    "gen": self.curve.gen.get_state(),
                    "errors": list(self.curve.errors),
                }
                torch.save(state, path / "state.pt")

        def load_checkpoint(self, checkpoint: Any) -> None:
            path = pathlib.Path(str(checkpoint))
            self.t = int(json.loads((path / "unit.json").read_text())["t"])
            if (path / "state.pt").exists():
                import torch

                state = torch.load(path / "state.pt", weights_only=False)
                self.curve.model.load_state_dict(state["model"])
                self.curve.opt.load_state_dict(state["opt"])
                self.curve.gen.set_state(state["gen"])
                self.curve.errors = list(state["errors"])

    return CurveTrainable


_PROBLEMS: dict[str, Any] = {}


def hyperband_milestones(max_t: int, eta: float) -> list[int]:
    """Every length at which some bracket of Ray's ``HyperBandScheduler`` decides.

    Bracket ``s`` first decides at ``int(max_t * eta**-s)``, then at ``eta`` times that, capped at
    ``max_t`` (``_Bracket.successive_halving``).
    """
    s_max_1 = round(math.log(max_t) / math.log(eta)) + 1
    found: set[int] = set()
    for s in range(s_max_1):
        r = int(max_t * eta**-s)
        while r > 0:
            found.add(r)
            if r >= max_t:
                break
            r = int(min(r * eta, max_t))
    return sorted(found)


def _problem(name: str) -> Any:
    if name not in _PROBLEMS:
        _PROBLEMS[name] = make_problem(name)
    return _PROBLEMS[name]


def _domain(param: Any) -> Any:
    from ray import tune

    if param.kind == "int":
        return tune.randint(int(param.low), int(param.high) + 1)
    if param.log:
        return tune.loguniform(param.low, param.high)
    return tune.uniform(param.low, param.high)


def ensure_ray(workers: int) -> None:
    """Start Ray once for all BOHB runs, with ``workers`` logical CPUs."""
    import ray

    if ray.is_initialized():
        return
    paths = [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)


def run_ray_bohb(
    problem_name: str, *, seed: int, workers: int, budget: int, divisor: float
) -> RunResult:
    """One BOHB search until ``budget`` units are trained; the results in arrival order."""
    from ray import tune
    from ray.tune.schedulers import HyperBandForBOHB
    from ray.tune.search.bohb import TuneBOHB

    ensure_ray(workers)
    problem = _problem(problem_name)
    reports: list[Report] = []
    seen_trials: set[str] = set()

    class Count(tune.Callback):
        def on_trial_result(
            self, iteration: int, trials: Any, trial: Any, result: dict, **info: Any
        ) -> None:
            seen_trials.add(trial.trial_id)
            for unit, value, true in result["units"]:
                if len(reports) >= budget:
                    return
                reports.append(Report(len(reports) + 1, 0, trial.trial_id, int(unit), value, true))

    class BudgetStopper(tune.Stopper):
        def __call__(self, trial_id: str, result: dict) -> bool:
            return False

        def stop_all(self) -> bool:
            return len(reports) >= budget

    space: dict[str, Any] = {p.name: _domain(p) for p in problem.space}
    space.update({"__problem": problem_name, "__seed": seed, "__eta": divisor})
    scheduler = HyperBandForBOHB(
        time_attr="unit", max_t=problem.max_length, reduction_factor=divisor
    )
    searcher = TuneBOHB(seed=seed)
    with tempfile.TemporaryDirectory(prefix="bench-bohb-") as tmp:
        tuner = tune.Tuner(
            tune.with_resources(_trainable_class(), {"cpu": 1}),
            param_space=space,
            tune_config=tune.TuneConfig(
                metric="val_error",
                mode="min",
                scheduler=scheduler,
                search_alg=searcher,
                num_samples=-1,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                storage_path=tmp,
                name="bohb",
                stop=BudgetStopper(),
                callbacks=[Count()],
                verbose=0,
                checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
            ),
        )
        _quiet_fit(tuner)
    spent = len(reports)
    ended = "budget" if spent >= budget else "finished"
    return RunResult(reports, spent, 0, len(seen_trials), 0, 0, ended)


def _quiet_fit(tuner: Any) -> None:
    import logging

    for name in ("ray.tune", "ray", "hpbandster"):
        logging.getLogger(name).setLevel(logging.ERROR)
    stdout = sys.stdout
    try:
        tuner.fit()
    finally:
        sys.stdout = stdout
