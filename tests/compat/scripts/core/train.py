"""A Determined Core API script, as Determined's core_api tutorial writes it (import changed).

``x`` grows by the hyperparameter ``increment_by`` every batch, so ``x == increment_by * batches``
at every report of a trial that resumes exactly where it paused. Two ways to meet the searcher:

- default (Determined 0.38): validations carry the time metric ``batches``; the script stops
  when ``core_context.preempt.should_preempt()`` says so (a pause) and resumes from
  ``info.latest_checkpoint``;
- ``--operations`` (Determined 0.37): train to each ``op.length`` and ``op.report_completed(x)``.

``--fail-at N`` raises at batch N; ``increment_by: 0`` raises ``InvalidHP``.
"""

import argparse
import logging
import pathlib

import searchlab as det


def save_state(x, steps_completed, trial_id, checkpoint_directory):
    with checkpoint_directory.joinpath("state").open("w") as f:
        f.write(f"{x},{steps_completed},{trial_id}")


def load_state(trial_id, checkpoint_directory):
    checkpoint_directory = pathlib.Path(checkpoint_directory)
    with checkpoint_directory.joinpath("state").open("r") as f:
        x, steps_completed, ckpt_trial_id = [int(field) for field in f.read().split(",")]
    if ckpt_trial_id == trial_id:
        return x, steps_completed
    return x, 0


def checkpoint(core_context, x, steps_completed, trial_id):
    with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (path, _):
        save_state(x, steps_completed, trial_id, path)


def by_time_metric(core_context, x, start, max_length, trial_id, increment_by, fail_at):
    for batch in range(start, max_length):
        if batch == fail_at:
            raise RuntimeError(f"failing at batch {batch} as asked")
        x += increment_by
        steps_completed = batch + 1
        if steps_completed % 2 == 0:
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
            core_context.train.report_validation_metrics(
                steps_completed=steps_completed, metrics={"x": x, "batches": steps_completed}
            )
            checkpoint(core_context, x, steps_completed, trial_id)
            if core_context.preempt.should_preempt():
                return


def by_operations(core_context, x, start, trial_id, increment_by):
    batch = start
    for op in core_context.searcher.operations():
        while batch < op.length:
            x += increment_by
            batch += 1
            if batch % 2 == 0:
                core_context.train.report_training_metrics(steps_completed=batch, metrics={"x": x})
        core_context.train.report_validation_metrics(steps_completed=batch, metrics={"x": x})
        op.report_completed(x)
        checkpoint(core_context, x, batch, trial_id)
        if core_context.preempt.should_preempt():
            return


def main():
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-length", type=int, default=16)
    parser.add_argument("--operations", action="store_true")
    parser.add_argument("--fail-at", type=int, default=-1)
    args = parser.parse_args()
    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    latest_checkpoint = info.latest_checkpoint
    trial_id = info.trial.trial_id
    increment_by = info.trial.hparams["increment_by"]
    print(f"run {info.trial._trial_run_id} from {latest_checkpoint}", flush=True)
    with det.core.init() as core_context:
        if increment_by == 0:
            raise det.InvalidHP("increment_by must not be 0")
        x, start = 0, 0
        if latest_checkpoint is not None:
            with core_context.checkpoint.restore_path(latest_checkpoint) as path:
                x, start = load_state(trial_id, path)
        if args.operations:
            by_operations(core_context, x, start, trial_id, increment_by)
        else:
            by_time_metric(
                core_context, x, start, args.max_length, trial_id, increment_by, args.fail_at
            )


if __name__ == "__main__":
    main()
