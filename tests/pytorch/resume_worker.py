"""Run a toy trial in a fresh process: train to N batches, optionally from a checkpoint.

Usage: resume_worker.py OUT_FILE CKPT_DIR MAX_BATCHES [LATEST_CHECKPOINT]
Writes the final model/optimizer state, every report and the returned path to OUT_FILE.
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, sys.argv[0].rsplit("/", 2)[0] + "/fixtures")

from toy_trials import ToyTrial

from searchlab import pytorch


def main() -> None:
    out, ckpt_dir, max_batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    latest = sys.argv[4] if len(sys.argv) > 4 else None
    hp = {"global_batch_size": 8, "lr": 0.1, "n_train": 96}  # 12 batches an epoch
    with pytorch.init(hparams=hp, checkpoint_dir=ckpt_dir, seed=7) as ctx:
        trial = ToyTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        path = trainer.fit(
            max_length=pytorch.Batch(max_batches),
            validation_period=pytorch.Batch(10),
            checkpoint_period=pytorch.Batch(20),
            latest_checkpoint=latest,
        )
        torch.save(
            {
                "path": path,
                "model": trial.model.state_dict(),
                "optimizer": trial.opt.state_dict(),
                "sched": trial.sched.state_dict(),
                "validations": [
                    (r.batches, r.metrics) for r in trainer.reports if r.group == "validation"
                ],
                "initial_batch": ctx.get_initial_batch(),
            },
            out,
        )


if __name__ == "__main__":
    main()
