"""tuner's own training loop (`run`), with or without the user's loss and metrics (`hooks`).

Its pieces, each an object so the loop body never branches: `data` (datasets and batches;
`digits` without scikit-learn), `models`, `optim` (optimizers, lr schedule), `amp`, `parallel`
(one worker, DDP, FSDP2), `prefetch` (batches onto the device), `batchsize`
(`find_batch_size`), `parts` (the live objects of a trial and what a checkpoint holds). Beside
the loop: `probe` (the memory probe of `gpus_per_worker: pack`), `autotune` (the measured arms
of `training.autotune`) and `weights` (a model rebuilt from a trial's configuration, for
export). Imports `frame` only.
"""
