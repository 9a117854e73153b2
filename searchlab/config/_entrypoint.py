"""Entrypoints: a ``module:Class`` trial, or a command that runs a script (Determined 0.38).

Determined 0.38 names a command as the entrypoint (``python3 train.py --epochs 1``), possibly
under its launcher (``python3 -m determined.launch.torch_distributed python3 train.py``); older
configs name a ``PyTorchTrial`` class (``model_def:MNistTrial``), also through the launcher's
``--trial`` option. This module tells them apart and takes commands to pieces.

Example:
    >>> cmd = parse_command("python3 -m searchlab.launch.torch_distributed python3 train.py -e 1")
    >>> cmd.launcher, cmd.script_file, cmd.script_argv
    (True, 'train.py', ['python3', 'train.py', '-e', '1'])
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

from searchlab.config._length import ConfigFieldError
from searchlab.launch._argv import is_python

__all__ = [
    "LAUNCHER_MODULE",
    "ScriptCommand",
    "class_entrypoint",
    "command_problem",
    "is_command",
    "is_python",
    "parse_command",
]

LAUNCHER_MODULE = "searchlab.launch.torch_distributed"
# Determined's spelling of the same launcher: accepted as the import-changed one.
_LAUNCHERS = (LAUNCHER_MODULE, "determined.launch.torch_distributed")
_OTHER_LAUNCHERS = ("horovod", "deepspeed", "tensorflow")
_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_LAUNCHER_TRIAL = re.compile(r"--trial[ =](\S+)")


@dataclasses.dataclass(frozen=True)
class ScriptCommand:
    """A command entrypoint, taken apart.

    ``argv`` is the whole command; ``script_argv`` the script's own command (after the
    launcher and its options, when there is one); ``script_file`` / ``module`` what that
    command runs (``python3 train.py`` / ``python3 -m pkg.train``), when it says.
    """

    argv: list[str]
    launcher: bool
    launcher_args: list[str]
    script_argv: list[str]
    script_file: str | None
    module: str | None


def class_entrypoint(value: str) -> str | None:
    """The ``module:Class`` an entrypoint names (also through the launcher's ``--trial``)."""
    value = value.strip()
    launched = _LAUNCHER_TRIAL.search(value)
    if launched and any(f"{root}.launch" in value for root in ("determined", "searchlab")):
        value = launched.group(1)
    return value if _CLASS.match(value) else None


def is_command(value: str) -> bool:
    """True for an entrypoint that runs a command rather than naming a trial class."""
    if class_entrypoint(value) is not None:
        return False
    text = value.strip()
    return bool(text) and (any(c.isspace() for c in text) or text.endswith((".py", ".sh")))


def parse_command(value: str) -> ScriptCommand:
    """Take a command entrypoint apart.

    Raises:
        ConfigFieldError: a command that cannot be split (an open quote), a launcher
            searchlab does not have, or a launcher with no script to launch.
    """
    try:
        argv = shlex.split(value)
    except ValueError as exc:
        raise ConfigFieldError(f"cannot split the command {value!r} ({exc})") from None
    if not argv:
        raise ConfigFieldError("must not be empty")
    launcher_args: list[str] = []
    script = argv
    launcher = False
    if len(argv) >= 3 and is_python(argv[0]) and argv[1] == "-m":
        module = argv[2]
        for other in _OTHER_LAUNCHERS:
            if module in (f"determined.launch.{other}", f"searchlab.launch.{other}"):
                raise ConfigFieldError(
                    f"{module}: searchlab launches scripts with torch.distributed only; use "
                    f"python3 -m {LAUNCHER_MODULE} python3 SCRIPT.py"
                )
        if module in _LAUNCHERS:
            launcher = True
            rest = argv[3:]
            if "--" in rest:
                split = rest.index("--")
                launcher_args, script = rest[:split], rest[split + 1 :]
            else:
                script = rest
            if not script:
                raise ConfigFieldError(
                    f"{module} needs the script to launch, e.g. "
                    f"python3 -m {LAUNCHER_MODULE} python3 train.py"
                )
    script_file, module_name = _what_runs(script)
    return ScriptCommand(argv, launcher, launcher_args, list(script), script_file, module_name)


def _what_runs(script: list[str]) -> tuple[str | None, str | None]:
    """The script file or module a command runs, when it names one."""
    if script and script[0].endswith(".py"):
        return script[0], None
    if len(script) >= 2 and is_python(script[0]):
        if script[1] == "-m" and len(script) >= 3:
            return None, script[2]
        if not script[1].startswith("-"):
            return script[1], None
    return None, None


def command_problem(entrypoint: str, model_dir: str, slots_per_trial: int) -> str | None:
    """Why a command entrypoint cannot run in ``model_dir`` (None when it can, as far as
    can be told before running it)."""
    command = parse_command(entrypoint)
    if command.script_file is not None:
        script = pathlib.Path(model_dir) / command.script_file
        if not script.is_file():
            return (
                f"{entrypoint!r}: no {command.script_file} in the model directory {model_dir}; "
                "pass the directory holding it (searchlab run CONFIG MODEL_DIR)"
            )
    if slots_per_trial > 1 and not command.launcher:
        return (
            f"{entrypoint!r} runs one process, but resources.slots_per_trial is "
            f"{slots_per_trial}; launch it on every slot: python3 -m {LAUNCHER_MODULE} "
            f"{shlex.join(command.script_argv)}"
        )
    return None
