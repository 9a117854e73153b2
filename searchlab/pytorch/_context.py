"""``PyTorchTrialContext``: what a trial asks searchlab for, and what it hands over."""

from __future__ import annotations

import contextlib
import logging
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._amp import AmpState
from searchlab.pytorch._callback import PyTorchCallback
from searchlab.pytorch._data import to_device
from searchlab.pytorch._distributed import DistributedContext, wrap_data_parallel
from searchlab.pytorch._errors import TrialTypeError, TrialValueError
from searchlab.pytorch._experimental import PyTorchExperimentalContext
from searchlab.pytorch._lr_scheduler import LRScheduler
from searchlab.pytorch._reducer import MetricReducer, SimpleReducer
from searchlab.tensorboard import _paths as tensorboard_paths

__all__ = ["PyTorchExperimentalContext", "PyTorchTrialContext"]

logger = logging.getLogger("searchlab")


class PyTorchTrialContext:
    """The trial's view of searchlab: hyperparameters, device, and the objects it trains.

    Built by searchlab (or ``searchlab.pytorch.init()`` in a notebook) and passed to the
    trial's ``__init__``.

    Example:
        >>> def __init__(self, context):
        ...     self.model = context.wrap_model(Net(context.get_hparam("width")))
        ...     self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
    """

    def __init__(
        self,
        hparams: dict[str, Any],
        *,
        exp_conf: dict[str, Any] | None = None,
        distributed: DistributedContext | None = None,
        device: torch.device | str | None = None,
        trial_seed: int = 0,
        trial_id: str = "local",
        experiment_id: str = "local",
        aggregation_frequency: int = 1,
        tensorboard_path: str | pathlib.Path | None = None,
        enable_tensorboard_logging: bool = False,
    ) -> None:
        self._hparams = dict(hparams)
        self._exp_conf = dict(exp_conf or {})
        self.distributed = distributed or DistributedContext()
        self.device = (
            torch.device(device) if device is not None else _default_device(self.distributed)
        )
        self._trial_seed = trial_seed
        self._trial_id = trial_id
        self._experiment_id = experiment_id
        if aggregation_frequency < 1:
            raise TrialValueError(
                f"aggregation_frequency is {aggregation_frequency}, but must be >= 1"
            )
        self._aggregation_frequency = aggregation_frequency
        self._tensorboard_path = pathlib.Path(tensorboard_path or "tensorboard")
        self._tensorboard_writer: Any = None
        self._enable_tensorboard_logging = bool(enable_tensorboard_logging)
        tensorboard_paths.set_base_path(self._tensorboard_path)  # for TorchWriter()
        self.experimental = PyTorchExperimentalContext(self)
        self._amp = AmpState()
        self._allow_torch_loaders = False
        self._auto_to_device = True
        self._stop_requested = False
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[LRScheduler] = []
        self._passes_per_step: dict[int, int] = {}
        self._reducers: list[tuple[MetricReducer, str | None, bool, bool]] = []
        self._callbacks: dict[str, PyTorchCallback] = {}
        # Position, kept up to date by the training loop.
        self._initial_batch = 0
        self._current_batch = 0
        self._current_epoch = 0
        self._epoch_len: int | None = None
        self._stepped_this_batch = False
        self._training_started = False  # set by the training loop; wrapping must come before

    # -- hyperparameters and config ---------------------------------------------------
    def get_hparams(self) -> dict[str, Any]:
        return dict(self._hparams)

    def get_hparam(self, name: str) -> Any:
        """One hyperparameter; a nested group comes back as a dict."""
        if name not in self._hparams:
            raise TrialValueError(
                f"hyperparameter {name!r} is not defined; defined ones are "
                f"{sorted(self._hparams)}. Add it to the config's `hyperparameters` section"
            )
        return self._hparams[name]

    def get_global_batch_size(self) -> int:
        if "global_batch_size" not in self._hparams:
            raise TrialValueError(
                "get_global_batch_size() needs the hyperparameter `global_batch_size`; "
                "add it to the config's `hyperparameters` section"
            )
        return int(self._hparams["global_batch_size"])

    def get_per_slot_batch_size(self) -> int:
        gbs = self.get_global_batch_size()
        size = self.distributed.size
        if gbs < size:
            raise TrialValueError(
                f"global_batch_size is {gbs}, but must be >= slots_per_trial ({size}); raise "
                "global_batch_size or lower slots_per_trial"
            )
        if gbs % size:
            warnings.warn(
                f"global_batch_size {gbs} is not divisible by slots_per_trial {size}; "
                f"each worker uses {gbs // size}",
                stacklevel=2,
            )
        return gbs // size

    def get_experiment_config(self) -> dict[str, Any]:
        return dict(self._exp_conf)

    def get_data_config(self) -> dict[str, Any]:
        return dict(self._exp_conf.get("data") or {})

    def get_trial_id(self) -> str:
        return self._trial_id

    def get_experiment_id(self) -> str:
        return self._experiment_id

    def get_trial_seed(self) -> int:
        return self._trial_seed

    def get_initial_batch(self) -> int:
        """The batch this run started from: 0, or the batches trained before a resume."""
        return self._initial_batch

    # -- stop requests ---------------------------------------------------------------
    def get_stop_requested(self) -> bool:
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask searchlab to end the trial (with a checkpoint) after the current batch."""
        self._stop_requested = bool(stop_requested)

    # -- position --------------------------------------------------------------------
    def current_train_batch(self) -> int:
        return self._current_batch

    def current_train_epoch(self) -> int:
        return self._current_epoch

    def is_epoch_start(self) -> bool:
        return self._epoch_len is not None and self._current_batch % self._epoch_len == 0

    def is_epoch_end(self) -> bool:
        return self._epoch_len is not None and (self._current_batch + 1) % self._epoch_len == 0

    # -- wrapping --------------------------------------------------------------------
    def _check_not_training(self, call: str) -> None:
        if self._training_started:
            raise TrialDefinitionError(
                f"{call} was called after training started; wrap every model, optimizer, "
                "scheduler and scaler in the trial's __init__"
            )

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to the trial's device (and into DDP when distributed).

        The DDP wrapper forwards attribute access to your module, as Determined's does, so
        ``self.model.my_attr`` and ``self.model.my_method()`` work on every slot count.
        """
        self._check_not_training("wrap_model()")
        if not isinstance(model, torch.nn.Module):
            raise TrialTypeError(f"wrap_model() got {type(model).__name__}; pass a torch.nn.Module")
        model = model.to(self.device)
        if self.distributed.size > 1:
            model = wrap_data_parallel(model, self.device)
        self.models.append(model)
        return model

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, backward_passes_per_step: int = 1
    ) -> torch.optim.Optimizer:
        """Register ``optimizer``; it steps every ``backward_passes_per_step`` batches."""
        self._check_not_training("wrap_optimizer()")
        if backward_passes_per_step < 1:
            raise TrialValueError(
                f"backward_passes_per_step is {backward_passes_per_step}, but must be >= 1"
            )
        if not self.models:
            raise TrialDefinitionError(
                "wrap_optimizer() was called before wrap_model(): wrap the model first, then "
                "build the optimizer from the wrapped model's parameters"
            )
        self.optimizers.append(optimizer)
        self._passes_per_step[id(optimizer)] = backward_passes_per_step
        return optimizer

    def wrap_lr_scheduler(
        self,
        lr_scheduler: Any,
        step_mode: LRScheduler.StepMode,
        frequency: int = 1,
    ) -> LRScheduler:
        self._check_not_training("wrap_lr_scheduler()")
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
        if isinstance(lr_scheduler, plateau) and step_mode != LRScheduler.StepMode.MANUAL_STEP:
            raise TrialValueError(
                f"wrap_lr_scheduler() got a ReduceLROnPlateau with step_mode={step_mode}; it "
                "needs a metric to step, so use step_mode=MANUAL_STEP and call "
                "scheduler.step(metrics[...]) yourself, e.g. in a callback's on_validation_end"
            )
        opt = getattr(lr_scheduler, "optimizer", None)
        if opt is not None and not any(opt is o for o in self.optimizers):
            raise TrialDefinitionError(
                "wrap_lr_scheduler() got a scheduler whose optimizer was not wrapped; build "
                "it on the optimizer returned by context.wrap_optimizer()"
            )
        wrapped = LRScheduler(lr_scheduler, step_mode, frequency)
        self.lr_schedulers.append(wrapped)
        return wrapped

    def wrap_scaler(self, scaler: Any) -> Any:
        """Register a ``GradScaler`` you use yourself; searchlab saves and restores it."""
        self._check_not_training("wrap_scaler()")
        self._amp.add_manual_scaler(scaler)
        return scaler

    def wrap_reducer(
        self,
        reducer: MetricReducer | Callable[[list[Any]], Any],
        name: str | None = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> MetricReducer:
        """Report a custom reducer's value as metric ``name`` (or its dict keys if ``name`` is None).

        ``reducer`` is a :class:`MetricReducer`, or a function that gets the list of every
        value passed to ``update()`` in the window (on every worker) and returns the metric;
        for a function, the returned :class:`SimpleReducer` has that ``update(value)``.
        """
        if any(r is reducer for r, _, _, _ in self._reducers):
            raise TrialDefinitionError(
                f"wrap_reducer() got the same {type(reducer).__name__} twice; wrap each "
                "reducer once"
            )
        if not isinstance(reducer, MetricReducer):
            if not callable(reducer):
                raise TrialTypeError(
                    f"wrap_reducer() got {type(reducer).__name__}; pass a function of the list "
                    "of values, or a searchlab.pytorch.MetricReducer"
                )
            reducer = SimpleReducer(reducer)
        reducer.reset()
        self._reducers.append((reducer, name, for_training, for_validation))
        return reducer

    # -- training steps ---------------------------------------------------------------
    def to_device(self, data: Any) -> Any:
        non_blocking = self.device.type == "cuda"
        return to_device(data, self.device, non_blocking=non_blocking)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context ``use_amp()`` trains under (a no-op without AMP)."""
        return self._amp.autocast(self.device)

    def backward(
        self,
        loss: torch.Tensor,
        gradient: torch.Tensor | None = None,
        retain_graph: bool = False,
        create_graph: bool = False,
    ) -> None:
        """``loss.backward()``, scaled for fp16 AMP when ``use_amp()`` is on."""
        loss = self._amp.scale(loss)
        loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)

    def _passes(self, optimizer: torch.optim.Optimizer) -> int:
        return max(self._passes_per_step.get(id(optimizer), 1), self._aggregation_frequency)

    def _update_period(self) -> int:
        """Batches per optimizer update (the longest gradient accumulation of any optimizer)."""
        return max([self._aggregation_frequency, *self._passes_per_step.values()])

    def _end_batch(self) -> None:
        """After ``train_batch``: one ``update()`` of the automatic AMP scaler per stepped batch."""
        # GradScaler expects one update() after all step(opt) calls of an iteration.
        if self._stepped_this_batch and self._amp.auto_scaler is not None:
            self._amp.auto_scaler.update()
        self._stepped_this_batch = False

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Any = None,
        auto_zero_grads: bool = True,
        scaler: Any = None,
    ) -> None:
        """Step ``optimizer`` (every N-th batch under gradient accumulation).

        Args:
            optimizer: a wrapped optimizer.
            clip_grads: ``fn(parameters)`` run on the gradients before the step, e.g.
                ``lambda p: torch.nn.utils.clip_grad_norm_(p, 1.0)``.
            auto_zero_grads: zero the gradients after the step.
            scaler: the ``GradScaler`` given to ``wrap_scaler`` when you manage AMP yourself;
                as in Determined, call ``scaler.update()`` yourself after the optimizer steps
                of a batch.
        """
        if id(optimizer) not in self._passes_per_step:
            raise TrialDefinitionError(
                "step_optimizer() got an optimizer that was not wrapped: pass the object "
                "returned by context.wrap_optimizer()"
            )
        passes = self._passes(optimizer)
        if (self._current_batch + 1) % passes:
            return  # accumulating: not the last batch of this optimizer's window
        params = [p for group in optimizer.param_groups for p in group["params"]]
        scaler = scaler or self._amp.auto_scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        if passes > 1:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(passes)
        if clip_grads is not None:
            clip_grads(params)
        for cb in self._callbacks.values():
            if type(cb).on_before_optimizer_step is not PyTorchCallback.on_before_optimizer_step:
                cb.on_before_optimizer_step(params)
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
        if auto_zero_grads:
            optimizer.zero_grad(set_to_none=True)
        self._stepped_this_batch = True
        for sched in self.lr_schedulers:
            if sched._steps_with(optimizer):
                sched._tick(LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP)

    # -- TensorBoard ------------------------------------------------------------------
    def get_tensorboard_path(self) -> pathlib.Path:
        return self._tensorboard_path

    def get_tensorboard_writer(self) -> Any:
        """A ``SummaryWriter`` writing into ``get_tensorboard_path()``.

        torch's ``torch.utils.tensorboard`` writer as in Determined, or tensorboardX's (same
        methods) where the ``tensorboard`` package is not installed.
        """
        if self._tensorboard_writer is None:
            from searchlab.tensorboard import summary_writer

            self._tensorboard_path.mkdir(parents=True, exist_ok=True)
            self._tensorboard_writer = summary_writer(self._tensorboard_path)
        return self._tensorboard_writer

    def set_enable_tensorboard_logging(self, enable_tensorboard_logging: bool) -> None:
        """Whether the trainer writes the reported metrics to TensorBoard (``Determined/...``)."""
        if not isinstance(enable_tensorboard_logging, bool):
            raise TrialTypeError(
                "set_enable_tensorboard_logging() got "
                f"{type(enable_tensorboard_logging).__name__}; pass True or False"
            )
        self._enable_tensorboard_logging = enable_tensorboard_logging

    def get_enable_tensorboard_logging(self) -> bool:
        return self._enable_tensorboard_logging

    def close(self) -> None:
        # The loop's callbacks, which often hold the trial, which holds this context: a cycle
        # that would keep the closed trial's model on the GPU until a garbage collection.
        self._callbacks = {}
        if self._tensorboard_writer is not None:
            self._tensorboard_writer.close()
            self._tensorboard_writer = None


def _default_device(distributed: DistributedContext) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())  # set when the group formed
    return torch.device("cuda", distributed.local_rank % torch.cuda.device_count())
