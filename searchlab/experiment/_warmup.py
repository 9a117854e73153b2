"""Setting up the GPU while a new trial worker still imports the user's code.

A new actor process pays, before its first batch, for the imports of the user's model
module (torchvision and the like) and for the CUDA context, cuBLAS and the allocator. The
imports hold the interpreter; CUDA's set-up mostly waits in the driver with the interpreter
free. ``start_accelerator_warmup`` starts that set-up in a thread, so both go on at once;
the trial's first use of CUDA waits on torch's own initialisation lock until it is done.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["start_accelerator_warmup"]

logger = logging.getLogger("searchlab")


def start_accelerator_warmup(gpu_ids: list[str]) -> threading.Thread | None:
    """Initialise CUDA on this process's GPU in the background (None when it has no GPU).

    Call it only once the process's visible devices are final (Ray sets them before an
    actor's ``setup``): CUDA reads ``CUDA_VISIBLE_DEVICES`` once, at initialisation.
    """
    if not gpu_ids:
        return None
    thread = threading.Thread(target=_warm, name="searchlab-cuda-warmup", daemon=True)
    thread.start()
    return thread


def _warm() -> None:
    try:
        import torch

        if not torch.cuda.is_available():
            return
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the context and the caching allocator
        torch.cuda.current_blas_handle()  # cuBLAS's handle and workspace
    except Exception:  # the trial meets the same error when it uses CUDA, and reports it
        logger.debug("warming CUDA up failed", exc_info=True)
