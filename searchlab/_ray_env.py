"""Starting or joining Ray for one run, with settings scoped to that run.

Environment variables and logger levels searchlab needs while an experiment runs are set on
entry to :func:`ray_environment` and restored on exit, so a notebook that runs an experiment
keeps its own settings. Ray's security defaults are kept: Ray 2.60 starts local clusters with
token authentication, and searchlab never turns it off (``RAY_AUTH_MODE=disabled`` in the
environment is the user's own opt-out).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from typing import Any

from searchlab.errors import ConfigError
from searchlab.experiment._compat import (
    TUNE_LOGGERS,
    TUNE_MESSAGES_REPORTED_BY_SEARCHLAB,
    TUNE_RESTORE_FAILED,
    TUNE_SLOW_OPERATION,
    keep_prestarted_workers,
)

__all__ = ["RayConnection", "connect_ray", "ray_environment", "ray_init_kwargs"]

# Read by Ray or Tune at import or run time. TUNE_GLOBAL_CHECKPOINT_S=1: Tune saves the
# experiment state every second, so a killed driver loses at most a second of search decisions.
_RUN_ENV = {
    "RAY_AIR_NEW_OUTPUT": "0",
    "RAY_DEDUP_LOGS": "0",
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "1000",
    "RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS": "0",
    "TUNE_GLOBAL_CHECKPOINT_S": "1",
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
    # searchlab writes each trial's results itself (``_loggers.ResultLog``); Tune's automatic
    # JSON/CSV/TensorBoard loggers would only write staging copies, with a thread per trial.
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_CHDIR_TO_TRIAL_DIR": "0",
    # A trial's failure is reported by searchlab (one line; traceback in Results), not again
    # by Ray when nobody collects the failed call's result.
    "RAY_IGNORE_UNHANDLED_ERRORS": "1",
    # searchlab handles Ctrl-C itself: the first pauses every trial at a checkpoint.
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
}
_LEVELS = {
    "ray": logging.WARNING,
    "ray.tune": logging.WARNING,
    "ray.train": logging.WARNING,
    "ray.data": logging.WARNING,
}


class _TuneMessages(logging.Filter):
    """Keeps Ray Tune's messages that matter (placement, resources) on one line each, and
    drops what searchlab reports itself, in its own words: each trial failure (one line per
    trial, traceback in ``Results``), a failed restore (a one-line error that says what to
    do), the end-of-run advice that names Ray's API (``Tuner.restore``) instead of
    ``searchlab resume``, and the warnings that one of Tune's own operations was slow (a line
    per slow call on a busy driver). Notes the reason of a failed restore for that error."""

    def __init__(self) -> None:
        super().__init__()
        self.restore_failure: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(TUNE_RESTORE_FAILED) and record.exc_info:
            exc = record.exc_info[1]
            self.restore_failure = f"{type(exc).__name__}: {exc}"
        if (
            message.startswith(TUNE_MESSAGES_REPORTED_BY_SEARCHLAB)
            or TUNE_SLOW_OPERATION in message
        ):
            return False
        if record.exc_info and record.exc_info[1] is not None:  # a traceback: one line instead
            exc = record.exc_info[1]
            record.msg = f"{message.rstrip(': ')}: {type(exc).__name__}: {exc}"
            record.args, record.exc_info, record.exc_text = (), None, None
        if record.stack_info:
            record.stack_info = None
        return True


@contextlib.contextmanager
def ray_environment(extra: dict[str, str] | None = None) -> Iterator[_TuneMessages]:
    """Set the run's environment variables and logger levels; restore them on exit.

    Yields the filter on Tune's log records, which notes a restore failure Tune logged.
    """
    # The run's defaults where the user set nothing; ``extra`` always.
    values = {k: v for k, v in _RUN_ENV.items() if k not in os.environ} | (extra or {})
    loggers = [logging.getLogger(n) for n in _LEVELS]
    saved_levels = [lg.level for lg in loggers]
    filtered = [logging.getLogger(n) for n in TUNE_LOGGERS]
    messages = _TuneMessages()
    try:
        with _environ(values):
            for lg, level in zip(loggers, _LEVELS.values()):
                lg.setLevel(level)
            for lg in filtered:
                lg.addFilter(messages)
            yield messages
    finally:
        for lg in filtered:
            lg.removeFilter(messages)
        for lg, level in zip(loggers, saved_levels):
            lg.setLevel(level)


def ray_init_kwargs() -> dict[str, Any]:
    return {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": False,
    }


@dataclasses.dataclass(frozen=True)
class RayConnection:
    """How this run reached Ray."""

    started: bool  # this call started or joined Ray (and so should shut it down)
    working_dir: bool  # the job's runtime environment carries the model directory
    # The environment Ray's workers inherited, where Ray started here without a runtime
    # environment (None otherwise). Kept in memory only: it may hold the user's secrets.
    worker_environ: dict[str, str] | None = dataclasses.field(default=None, repr=False)


def connect_ray(
    address: str | None, runtime_env: dict[str, Any] | None, *, prestart: bool = False
) -> RayConnection:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start Ray here.

    ``runtime_env`` (the model directory as ``working_dir`` and the workers' ``env_vars``)
    becomes the job's runtime environment, except where Ray starts here with ``prestart``.
    Ray starts a worker per CPU as it starts (``ray::IDLE``), but gives a job with a runtime
    environment none of them: each trial's actor would wait for a new process. There the
    environment variables are set in this process while Ray starts, for all its workers to
    inherit (``worker_environ``); Ray keeps those workers until trials take them (it would
    kill them once Tune's placement groups reserve every CPU); and the caller ships the model
    directory itself (``working_dir`` False), as it does when Ray was already initialised in
    this process (a notebook or the test suite; ``started`` False). Without an address, Ray
    starts a new instance even where ``ray start`` runs one on this machine (its address, or
    ``auto``, joins that one).

    Raises:
        ConfigError: the cluster refused the connection (token authentication) or cannot be
            reached; the message says how to fix it.
    """
    import ray

    if ray.is_initialized():
        return RayConnection(started=False, working_dir=False)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        try:
            ray.init(address=address, runtime_env=runtime_env, **ray_init_kwargs())
        except Exception as exc:
            raise ConfigError(_connect_error(address, exc)) from None
        return RayConnection(started=True, working_dir=runtime_env is not None)
    # A new instance, whose processes this one starts: by default Ray would join one that
    # `ray start` runs on this machine, whose workers inherited nothing of this process.
    if not prestart:
        ray.init(address="local", runtime_env=runtime_env, **ray_init_kwargs())
        return RayConnection(started=True, working_dir=runtime_env is not None)
    env_vars = (runtime_env or {}).get("env_vars", {})
    with _environ(env_vars):
        inherited = dict(os.environ)  # what Ray's processes start with
        ray.init(address="local", _system_config=keep_prestarted_workers(), **ray_init_kwargs())
    return RayConnection(started=True, working_dir=False, worker_environ=inherited)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment for the block, then restore it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _connect_error(address: str, exc: Exception) -> str:
    text = " ".join(str(exc).split())
    if type(exc).__name__ == "AuthenticationError" or "token" in text.lower():
        return (
            f"--address {address}: the Ray cluster requires token authentication and this "
            "driver has no token; set RAY_AUTH_TOKEN to the cluster's token (or put it in "
            "~/.ray/auth_token; `ray get-auth-token` prints it on the head node) and retry"
        )
    hint = ""
    if not _has_token():
        hint = (
            "; if the cluster uses token authentication (Ray's default for new clusters), "
            "set RAY_AUTH_TOKEN to its token (`ray get-auth-token` on the head node)"
        )
    return (
        f"--address {address}: cannot connect to the Ray cluster there ({type(exc).__name__}: "
        f"{text[:160]}); check the address (`ray status` on the head node){hint}"
    )


def _has_token() -> bool:
    """Whether this process has a Ray token to offer (Ray's own places for one)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return os.path.isfile(path)
