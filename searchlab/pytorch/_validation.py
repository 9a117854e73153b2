"""Running a trial's validation and reducing its metrics."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch

from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._callback import PyTorchCallback
from searchlab.pytorch._context import PyTorchTrialContext
from searchlab.pytorch._loaders import epoch_loader
from searchlab.pytorch._metrics import (
    check_metrics,
    is_numerical_scalar,
    numeric_values,
    reduce_validation,
    report_value,
)
from searchlab.pytorch._trial import PyTorchTrial

if TYPE_CHECKING:
    from searchlab.pytorch._loop import LoopSettings

__all__ = ["Validator"]


def _overrides(trial: PyTorchTrial, name: str) -> bool:
    return getattr(type(trial), name) is not getattr(PyTorchTrial, name)


class Validator:
    """Validates a trial with ``evaluate_batch`` or ``evaluate_full_dataset``."""

    def __init__(
        self,
        trial: PyTorchTrial,
        context: PyTorchTrialContext,
        settings: LoopSettings,
        callbacks: dict[str, PyTorchCallback],
    ) -> None:
        by_batch, full = (
            _overrides(trial, "evaluate_batch"),
            _overrides(trial, "evaluate_full_dataset"),
        )
        name = type(trial).__name__
        if by_batch == full:
            which = "both" if by_batch else "neither"
            raise TrialDefinitionError(
                f"{name} defines {which} of evaluate_batch() and evaluate_full_dataset(); "
                "define exactly one"
            )
        self._trial, self._context, self._settings = trial, context, settings
        self._callbacks = callbacks
        self._full = full
        self._pass_batch_idx = (
            by_batch and len(inspect.signature(trial.evaluate_batch).parameters) >= 2
        )
        self._loader: Any = None

    def _data(self) -> Any:
        if self._loader is None:
            spec = self._trial.build_validation_data_loader()
            where = f"{type(self._trial).__name__}.build_validation_data_loader()"
            self._loader = epoch_loader(spec, self._context, where, training=False)
        return self._loader

    def validate(self) -> dict[str, Any]:
        ctx = self._context
        for cb in self._callbacks.values():
            cb.on_validation_start()
            cb.on_validation_epoch_start()
        for reducer, _, _, for_validation in ctx._reducers:
            if for_validation:
                reducer.reset()
        modes = [m.training for m in ctx.models]
        for m in ctx.models:
            m.eval()
        try:
            with torch.no_grad(), ctx._amp.autocast(ctx.device):
                metrics = self._full_dataset() if self._full else self._by_batch()
        finally:
            for m, mode in zip(ctx.models, modes):
                m.train(mode)
        metrics.update(self.reducer_metrics(training=False))
        self._check_searcher_metric(metrics)
        if ctx.distributed.rank == 0:
            for cb in self._callbacks.values():
                cb.on_validation_end(metrics)
                cb.on_validation_epoch_end([])
        return metrics

    def _by_batch(self) -> dict[str, Any]:
        ctx, trial = self._context, self._trial
        per_batch: dict[str, list[Any]] = {}
        loader = self._data().loader_for(0, 0)
        limit = 1 if self._settings.test_mode else None
        for idx, batch in enumerate(loader):
            if limit is not None and idx >= limit:
                break
            if ctx._auto_to_device:
                batch = ctx.to_device(batch)
            if self._pass_batch_idx:
                out = trial.evaluate_batch(batch, idx)
            else:
                out = trial.evaluate_batch(batch)  # type: ignore[call-arg]
            out = check_metrics(out, f"{type(trial).__name__}.evaluate_batch()")
            for k, v in out.items():
                if v is None:  # skipped, as in training windows
                    continue
                if isinstance(v, torch.Tensor):
                    v = v.detach().reshape(()) if v.numel() == 1 else v.detach().cpu()
                per_batch.setdefault(k, []).append(v)
        values = {k: self._numbers(k, v) for k, v in per_batch.items()}
        return reduce_validation(values, trial.evaluation_reducer(), ctx.distributed)

    def _numbers(self, name: str, values: list[Any]) -> list[float]:
        """A metric's per-batch values as the numbers its reducer combines.

        Scalars give one number a batch; equal-shape arrays are reduced over all their
        elements, as Determined's reducers did on the stacked arrays.
        """
        if all(is_numerical_scalar(x) for x in values):
            return torch.stack(  # type: ignore[no-any-return]
                [torch.as_tensor(x, dtype=torch.float64).cpu().reshape(()) for x in values]
            ).tolist()
        arr = numeric_values(values)
        if arr is None:
            raise TrialDefinitionError(
                f"{type(self._trial).__name__}.evaluate_batch() returned metric {name!r} whose "
                "values are not numbers of one shape, so its reducer cannot combine them; "
                "return numbers or equal-shape tensors, or compute it in evaluate_full_dataset() "
                "or with context.wrap_reducer()"
            )
        return arr.ravel().tolist()  # type: ignore[no-any-return]

    def _full_dataset(self) -> dict[str, Any]:
        ctx = self._context
        metrics: dict[str, Any] = {}
        if ctx.distributed.rank == 0:
            out = self._trial.evaluate_full_dataset(self._data().loader_for(0, 0))
            out = check_metrics(out, f"{type(self._trial).__name__}.evaluate_full_dataset()")
            metrics = {k: report_value(v) for k, v in out.items()}
        return dict(ctx.distributed.broadcast(metrics))

    def reducer_metrics(self, *, training: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for reducer, name, for_training, for_validation in self._context._reducers:
            if not (for_training if training else for_validation):
                continue
            gathered = self._context.distributed.allgather(reducer.per_slot_reduce())
            value = reducer.cross_slot_reduce(gathered)
            reducer.reset()
            if name is None:
                if not isinstance(value, dict):
                    raise TrialDefinitionError(
                        f"{_reducer_name(reducer)} returned {type(value).__name__}; without a "
                        "name, wrap_reducer() needs a dict of metrics: pass name=... or "
                        "return a dict"
                    )
                out.update({k: report_value(v) for k, v in value.items()})
            elif isinstance(value, dict):
                raise TrialDefinitionError(
                    f"{_reducer_name(reducer)} was wrapped with name={name!r} but returned a "
                    "dict; return one value, or wrap it with name=None to report the dict's keys"
                )
            else:
                out[name] = report_value(value)
        return out

    def _check_searcher_metric(self, metrics: dict[str, Any]) -> None:
        name = self._settings.searcher_metric
        if name is not None and name not in metrics:
            raise TrialDefinitionError(
                f"the searcher metric {name!r} is not among the validation metrics "
                f"{sorted(metrics)} that {type(self._trial).__name__} reported; return it from "
                "evaluate_batch()/evaluate_full_dataset() or change searcher.metric",
                config_path="searcher.metric",
            )
        if name is not None and not is_numerical_scalar(metrics[name]):
            shown = repr(metrics[name])[:80]
            raise TrialDefinitionError(
                f"the searcher metric {name!r} that {type(self._trial).__name__} reported is "
                f"{shown}, not a number; the searcher compares numbers: return a scalar",
                config_path="searcher.metric",
            )


def _reducer_name(reducer: Any) -> str:
    fn = getattr(reducer, "fn", None)  # a SimpleReducer: name the user's function
    if fn is not None:
        return f"the reducer function {getattr(fn, '__name__', repr(fn))}()"
    return f"{type(reducer).__name__}.cross_slot_reduce()"
