"""Loading trials: classes named by a spec, and trials rebuilt from checkpoints (as Determined's
``determined.pytorch._load``). A checkpoint is data: what it names is imported only when trusted.
"""

from __future__ import annotations

import functools
import importlib
import os
import pathlib
import site
import sys
import sysconfig
from typing import Any

from searchlab.core._import import _names_in
from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._checkpoint import CODE_DIR, load_checkpoint
from searchlab.pytorch._context import PyTorchTrialContext
from searchlab.pytorch._distributed import DistributedContext
from searchlab.pytorch._state import TrialState, restore_trial_state
from searchlab.pytorch._trainer import init
from searchlab.pytorch._trial import PyTorchTrial

__all__ = ["CheckpointLoadContext", "load_trial_class", "load_trial_from_checkpoint_path"]


class CheckpointLoadContext(PyTorchTrialContext):
    """A context to build a trial outside training (Determined's class of the name).

    To get a trial with its trained weights, ``load_trial_from_checkpoint_path(path,
    trial_class=MyTrial, trial_kwargs={...})`` builds it in such a context and loads them.

    Example:
        >>> trial = MyTrial(CheckpointLoadContext({"lr": 0.1, "global_batch_size": 32}), depth=3)
    """

    def __init__(
        self, hparams: dict[str, Any] | None = None, exp_conf: dict[str, Any] | None = None
    ) -> None:
        super().__init__(hparams or {}, exp_conf=exp_conf)


def _use_model_dir(model_dir: pathlib.Path) -> None:
    """Put ``model_dir`` first on ``sys.path`` and forget loaded modules that would stand in
    for the modules it provides.

    Model directories reuse generic module names (``model_def``, ``data``); without this, a
    notebook or test session that loads a second experiment, or that imported its own
    ``model_def`` from another folder, would get those modules instead of the experiment's.
    The caller's references to forgotten modules stay valid.
    """
    path = str(model_dir)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)
    previous = getattr(_use_model_dir, "current", None)
    _use_model_dir.current = path  # type: ignore[attr-defined]
    if previous is not None and previous != path:
        if previous in sys.path:
            sys.path.remove(previous)  # its modules must not stand in for the new dir's
        for name, module in list(sys.modules.items()):
            if _origin(module).startswith(previous + os.sep):
                del sys.modules[name]
    _forget_loaded_elsewhere(model_dir)


def _origin(module: Any) -> str:
    """The real path of the file a module was loaded from ("" for built-in and namespace ones)."""
    origin = getattr(module, "__file__", None)
    return os.path.realpath(origin) if isinstance(origin, str) else ""


@functools.cache
def _installed_dirs() -> tuple[str, ...]:
    """The standard library's and site-packages' folders, each ending in a separator (asked
    once per process: they do not move while it runs)."""
    dirs = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.update(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


def _forget_loaded_elsewhere(model_dir: pathlib.Path) -> None:
    """Forget each loaded module (and its submodules) whose name ``model_dir`` provides but
    that was loaded from another folder, so that the next import finds the directory's.

    Spared: the standard library and site-packages (a model directory may hold a
    ``logging.py``, which never replaced the loaded ``logging``), modules without a file, and
    searchlab itself.
    """
    inside = os.path.realpath(model_dir) + os.sep
    installed = _installed_dirs()
    for top in _names_in(str(model_dir)) - {"searchlab", "__main__"}:
        origin = _origin(sys.modules.get(top))
        if not origin or origin.startswith(inside) or origin.startswith(installed):
            continue
        for name in list(sys.modules):
            if name == top or name.startswith(top + "."):
                del sys.modules[name]


def load_trial_class(
    spec: str, model_dir: str | os.PathLike[str] | None = None
) -> type[PyTorchTrial]:
    """Import ``module:Class`` (with ``model_dir`` on ``sys.path``)."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise TrialDefinitionError(f"trial class {spec!r} must have the form `module:Class`")
    if model_dir is not None:
        directory = pathlib.Path(model_dir).resolve()
        _use_model_dir(directory)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrialDefinitionError(
            f"cannot import module {module_name!r} of {spec!r} from {model_dir or os.getcwd()}: "
            f"{exc}; check the entrypoint and the model directory"
        ) from exc
    obj: Any = module
    for part in class_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise TrialDefinitionError(
                f"module {module_name!r} has no class {class_name!r}; check the entrypoint"
            )
    if not (isinstance(obj, type) and issubclass(obj, PyTorchTrial)):
        raise TrialDefinitionError(
            f"{spec} is not a subclass of searchlab.pytorch.PyTorchTrial; derive it from PyTorchTrial"
        )
    return obj


def load_trial_from_checkpoint_path(
    path: str | os.PathLike[str],
    trial_class: type[PyTorchTrial] | None = None,
    trial_kwargs: dict[str, Any] | None = None,
    hparams: dict[str, Any] | None = None,
    *,
    torch_load_kwargs: dict[str, Any] | None = None,
    trusted: bool = False,
) -> PyTorchTrial:
    """The trial of a checkpoint, rebuilt with its trained weights (on CPU unless a GPU is there).

    A checkpoint is data: by default its state is loaded weights-only and the trial class is
    the one you pass. With ``trusted=True`` (only for checkpoints whose origin you trust) the
    state is fully unpickled and, without ``trial_class``, the class the checkpoint names is
    imported: from the checkpoint's own ``code/`` folder when it has one (Determined saved the
    model code there), else from the model directory its metadata names.

    Args:
        path: the checkpoint directory.
        trial_class: the ``PyTorchTrial`` subclass to build.
        trial_kwargs: extra keyword arguments for the trial's ``__init__``.
        hparams: hyperparameters for the context (default: the checkpoint's).
        torch_load_kwargs: passed to ``torch.load``, e.g. ``{"map_location": "cuda:0"}``.
        trusted: allow arbitrary pickled objects and importing the class the checkpoint names.

    Example:
        >>> trial = load_trial_from_checkpoint_path(results.best_checkpoint(), trial_class=MyTrial)
        >>> trial.model.eval()
    """
    state, meta = load_checkpoint(path, trusted=trusted, torch_load_kwargs=torch_load_kwargs)
    if trial_class is None:
        trial_class = _trial_class_named_by(pathlib.Path(path), meta, trusted=trusted)
    with init(
        hparams=hparams if hparams is not None else meta.get("hparams", {}),
        checkpoint_dir=pathlib.Path(path).parent,
        distributed=DistributedContext(),
        seed=int(meta.get("trial_seed") or 0),
        enable_tensorboard_logging=False,
    ) as context:
        trial = trial_class(context, **(trial_kwargs or {}))  # type: ignore[call-arg]
        callbacks = trial.build_callbacks()
        saved = TrialState.from_state_dict(state)
        restore_trial_state(saved, context, dict(callbacks), restore_rng=False)
    return trial


def _trial_class_named_by(
    path: pathlib.Path, meta: dict[str, Any], *, trusted: bool
) -> type[PyTorchTrial]:
    """The class a checkpoint's metadata names, imported only when the user trusts it."""
    spec = meta.get("trial_class")
    if not spec:
        raise TrialDefinitionError(
            f"{path}: the checkpoint does not name its trial class; pass trial_class=YourTrial"
        )
    code = path / CODE_DIR
    model_dir = code if code.is_dir() else meta.get("model_dir")
    if not trusted:
        where = model_dir if model_dir is not None else "the current sys.path"
        raise TrialDefinitionError(
            f"{path}: the checkpoint names trial class {spec!r} in {where}; importing it runs "
            "code the checkpoint chose: pass trial_class=YourTrial, or trusted=True to import "
            "it from there"
        )
    return load_trial_class(str(spec), model_dir)
