"""``python3 -m searchlab.launch.wrap_rank RANK -- COMMAND...``: COMMAND's output, each line
prefixed with ``[rank=RANK]`` (Determined's ``determined.launch.wrap_rank``).

``RANK`` may name an environment variable holding the rank (e.g. ``RANK``).

Example:
    >>> subprocess.run(["python3", "-m", "searchlab.launch.wrap_rank", "1", "--", "python3", "w.py"])
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence

from searchlab.launch.torch_distributed import _pipe_lines

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        raise SystemExit("usage: python3 -m searchlab.launch.wrap_rank RANK -- COMMAND...")
    rank = args[0] if args[0].isdigit() else os.environ.get(args[0], args[0])
    proc = subprocess.Popen(args[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    prefix = f"[rank={rank}] ".encode()
    threads = [
        threading.Thread(target=_pipe_lines, args=(stream, prefix, out), daemon=True)
        for stream, out in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))
    ]
    for thread in threads:
        thread.start()
    code = proc.wait()
    for thread in threads:
        thread.join(timeout=5)
    return code


if __name__ == "__main__":
    sys.exit(main())
