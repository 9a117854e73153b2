"""Launchers for script trials (Determined's ``determined.launch``).

``python3 -m searchlab.launch.torch_distributed python3 train.py`` runs a script on every slot
of its trial with torch.distributed's environment; ``searchlab.launch.wrap_rank`` prefixes a
command's output with its rank.

Example (an experiment config):
    entrypoint: python3 -m searchlab.launch.torch_distributed python3 train.py --epochs 1
"""

from __future__ import annotations

__all__: list[str] = []
