"""The problems of ``search_efficiency.py``: a synthetic learning-curve family and MLPs on digits.

Both give, for hyperparameters and a repetition seed, a learning curve: the validation error
after each unit of training (``1 .. max_length``). A curve is deterministic per (hyperparameters,
seed), and it is computed lazily, one unit at a time, so a trial that stops early costs nothing
more (the digits trainer keeps its model between calls, as a checkpoint would).

**synthetic** (``SyntheticCurves``): six hyperparameters (``lr`` on a log scale, ``x1``..``x5``
uniform). The final error comes from the 6-d Hartmann function (Dixon & Szego 1978), a standard
multi-modal test function; the curve has the power-law form ``pow4`` of Domhan, Springenberg
& Hutter (IJCAI 2015), ``e(t) = e_inf + (e_0 - e_inf) / (1 + t / tau)``, with a time scale
``tau`` set by ``lr`` and ``x5``, so fast configurations lead early and slow ones with a lower
asymptote overtake them later (curves cross). A small late rise (overfitting) for low ``x3``
makes some curves turn up, and every observation has Gaussian noise (sd 0.01) drawn from a
generator seeded by (seed, hyperparameters, t).

**digits** (``DigitsCurves``): an MLP (64 -> width -> 10, ReLU, dropout) trained with SGD and
momentum 0.9 on scikit-learn's digits: 400 training images and the other 1,397 for validation
(the split, the initial weights, the shuffling and the dropout masks all come from the seed),
batch 32, one unit = one epoch. Hyperparameters: ``lr`` (log), ``width`` (int),
``weight_decay`` (log), ``dropout``. Real training, real curves. The small training set makes
regularisation matter and the large validation set measures the error in steps of 0.07%:
with 900 training and 450 validation images, most configurations ended within a few images
of each other (steps of 0.22%), and the comparison measured validation noise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "PROBLEMS",
    "DigitsCurves",
    "Param",
    "Problem",
    "SyntheticCurves",
    "hartmann6",
    "make_problem",
]


@dataclasses.dataclass(frozen=True)
class Param:
    """One hyperparameter: ``float`` (uniform, or log-uniform with ``log``) or ``int`` (uniform)."""

    name: str
    kind: str  # "float" or "int"
    low: float
    high: float
    log: bool = False

    def searchlab(self) -> dict[str, Any]:
        """The hyperparameter in searchlab's (Determined's) config format."""
        if self.kind == "int":
            return {"type": "int", "minval": int(self.low), "maxval": int(self.high)}
        if self.log:
            lo, hi = math.log10(self.low), math.log10(self.high)
            return {"type": "log", "minval": lo, "maxval": hi, "base": 10}
        return {"type": "double", "minval": self.low, "maxval": self.high}


class Problem:
    """What every problem has: a name, a space, a max length and a curve per trial."""

    name = ""
    max_length = 0
    space: tuple[Param, ...] = ()
    has_true_value = False  # the curve knows a noise-free value (regret can be computed)
    optimum = 0.0  # lowest noise-free error reachable (synthetic); 0 for digits

    def curve(self, hparams: Mapping[str, Any], seed: int) -> Any:
        raise NotImplementedError


# Hartmann 6-d: coefficients and the global minimum from Dixon & Szego (1978).
_H6_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_H6_A = np.array(
    [
        [10, 3, 17, 3.5, 1.7, 8],
        [0.05, 10, 17, 0.1, 8, 14],
        [3, 3.5, 1.7, 10, 17, 8],
        [17, 8, 0.05, 10, 0.1, 14],
    ]
)
_H6_P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
H6_MIN = -3.32237
H6_ARGMIN = (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)


def hartmann6(z: Any) -> float:
    """The 6-d Hartmann function on [0, 1]^6; minimum -3.32237 at ``H6_ARGMIN``."""
    z = np.asarray(z, dtype=float)
    inner = np.sum(_H6_A * (z - _H6_P) ** 2, axis=1)
    return float(-np.sum(_H6_ALPHA * np.exp(-inner)))


def _key(hparams: Mapping[str, Any], names: tuple[str, ...]) -> bytes:
    return b"".join(struct.pack("<d", float(hparams[n])) for n in names)


def _stream_seed(seed: int, key: bytes, extra: int = 0) -> int:
    digest = hashlib.blake2b(key + struct.pack("<qq", seed, extra), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class SyntheticCurve:
    """The learning curve of one configuration: ``observe(t)`` (noisy) and ``true(t)``."""

    E0 = 0.9  # error before training (10 classes)
    NOISE = 0.01

    def __init__(self, z: tuple[float, ...], seed: int, key: bytes, max_length: int) -> None:
        self.e_inf = 0.05 + 0.5 * (1.0 + hartmann6(z) / -H6_MIN)
        u_lr, x3, x5 = z[5], z[2], z[4]
        self.tau = 10.0 ** (1.2 - 2.0 * u_lr + 1.0 * (0.5 - x5))
        self.overfit = 0.3 * max(0.0, 0.25 - x3)
        self.max_length = max_length
        self._seed, self._key = seed, key

    def true(self, t: int) -> float:
        decay = (self.E0 - self.e_inf) / (1.0 + t / self.tau)
        return self.e_inf + decay + self.overfit * (t / self.max_length) ** 2

    def observe(self, t: int) -> float:
        rng = np.random.default_rng(_stream_seed(self._seed, self._key, t))
        return self.true(t) + float(rng.normal(0.0, self.NOISE))


class SyntheticCurves(Problem):
    """Hartmann-6 asymptotes with crossing power-law curves (see the module doc).

    Example:
        >>> problem = SyntheticCurves()
        >>> curve = problem.curve({"lr": 0.04, "x1": 0.2, "x2": 0.15, "x3": 0.48,
        ...                        "x4": 0.28, "x5": 0.31}, seed=0)
        >>> round(curve.true(81), 3)
        0.066
    """

    name = "synthetic"
    max_length = 81
    has_true_value = True
    space = (
        Param("lr", "float", 1e-4, 1.0, log=True),
        *(Param(f"x{i}", "float", 0.0, 1.0) for i in range(1, 6)),
    )

    def __init__(self, max_length: int = 81) -> None:
        self.max_length = max_length
        best = self._curve(self._z_to_hparams(H6_ARGMIN), 0)
        self.optimum = min(best.true(t) for t in range(1, max_length + 1))

    def curve(self, hparams: Mapping[str, Any], seed: int) -> SyntheticCurve:
        return self._curve(hparams, seed)

    def _curve(self, hparams: Mapping[str, Any], seed: int) -> SyntheticCurve:
        u_lr = (math.log10(float(hparams["lr"])) + 4.0) / 4.0
        z = (*(float(hparams[f"x{i}"]) for i in range(1, 6)), u_lr)
        names = tuple(p.name for p in self.space)
        return SyntheticCurve(z, seed, _key(hparams, names), self.max_length)

    @staticmethod
    def _z_to_hparams(z: tuple[float, ...]) -> dict[str, float]:
        return {"lr": 10.0 ** (4.0 * z[5] - 4.0), **{f"x{i}": z[i - 1] for i in range(1, 6)}}


class DigitsCurve:
    """One MLP being trained on digits; ``observe(t)`` trains (once) up to epoch ``t``."""

    BATCH = 32

    def __init__(self, data: dict[str, Any], hparams: Mapping[str, Any], seed: int) -> None:
        import torch
        from torch import nn

        self._torch = torch
        self.data = data
        # Every random draw (weights, shuffling, dropout masks) comes from this trial's own
        # generator, so curves do not depend on how the runner interleaves trials.
        self.gen = torch.Generator().manual_seed(seed)
        width = int(hparams["width"])
        self.dropout = float(hparams["dropout"])
        first, last = nn.Linear(64, width), nn.Linear(width, 10)
        self.model = nn.Sequential(first, nn.ReLU(), last)
        with torch.no_grad():
            for layer in (first, last):
                bound = 1.0 / math.sqrt(layer.in_features)  # PyTorch's default init range
                layer.weight.uniform_(-bound, bound, generator=self.gen)
                layer.bias.uniform_(-bound, bound, generator=self.gen)
        self.opt = torch.optim.SGD(
            self.model.parameters(),
            lr=float(hparams["lr"]),
            momentum=0.9,
            weight_decay=float(hparams["weight_decay"]),
        )
        self.errors: list[float] = []

    def observe(self, t: int) -> float:
        while len(self.errors) < t:
            self.errors.append(self._epoch())
        return self.errors[t - 1]

    def true(self, t: int) -> float:
        return self.observe(t)

    def _epoch(self) -> float:
        torch = self._torch
        x, y = self.data["x_train"], self.data["y_train"]
        order = torch.randperm(len(x), generator=self.gen)
        for i in range(0, len(x), self.BATCH):
            idx = order[i : i + self.BATCH]
            self.opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(self._forward(x[idx], train=True), y[idx])
            if not torch.isfinite(loss):
                return 0.9  # diverged: as bad as guessing
            loss.backward()
            self.opt.step()
        with torch.no_grad():
            logits = self._forward(self.data["x_val"], train=False)
        if not torch.isfinite(logits).all():
            return 0.9
        return float((logits.argmax(1) != self.data["y_val"]).float().mean())

    def _forward(self, x: Any, *, train: bool) -> Any:
        hidden = self.model[1](self.model[0](x))
        if train and self.dropout > 0:
            keep = self._torch.rand(hidden.shape, generator=self.gen) >= self.dropout
            hidden = hidden * keep / (1.0 - self.dropout)
        return self.model[2](hidden)


class DigitsCurves(Problem):
    """MLPs on scikit-learn's digits, trained for real (see the module doc).

    Example:
        >>> curve = DigitsCurves().curve({"lr": 0.1, "width": 64, "weight_decay": 1e-4,
        ...                               "dropout": 0.1}, seed=0)
        >>> 0.0 <= curve.observe(3) <= 1.0
        True
    """

    name = "digits"
    max_length = 27
    TRAIN = 400  # the other 1,397 images validate: steps of 0.07% in the error
    space = (
        Param("lr", "float", 1e-3, 1.0, log=True),
        Param("width", "int", 16, 256),
        Param("weight_decay", "float", 1e-6, 1e-1, log=True),
        Param("dropout", "float", 0.0, 0.8),
    )

    def __init__(self, max_length: int = 27) -> None:
        import torch

        torch.set_num_threads(1)
        self.max_length = max_length
        self._data: dict[int, dict[str, Any]] = {}

    def data(self, seed: int) -> dict[str, Any]:
        if seed not in self._data:
            import torch
            from sklearn.datasets import load_digits

            x, y = load_digits(return_X_y=True)
            order = np.random.default_rng(seed).permutation(len(x))
            xt = torch.tensor(x[order] / 16.0, dtype=torch.float32)
            yt = torch.tensor(y[order], dtype=torch.long)
            n = self.TRAIN
            self._data[seed] = {
                "x_train": xt[:n],
                "y_train": yt[:n],
                "x_val": xt[n:],
                "y_val": yt[n:],
            }
        return self._data[seed]

    def curve(self, hparams: Mapping[str, Any], seed: int) -> DigitsCurve:
        return DigitsCurve(self.data(seed), hparams, seed)


PROBLEMS = {"synthetic": SyntheticCurves, "digits": DigitsCurves}


def make_problem(name: str) -> Problem:
    """The problem called ``name`` (``synthetic`` or ``digits``)."""
    try:
        return PROBLEMS[name]()  # type: ignore[abstract]
    except KeyError:
        raise ValueError(f"problem is {name!r}, but must be one of {sorted(PROBLEMS)}") from None
