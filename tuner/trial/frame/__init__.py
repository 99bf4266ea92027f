"""What every trial shares, whatever trains it (tuner's loop, the user's loop or script).

`spec` (what a trial is told besides its hyperparameters), `session` (where it reports: a Tune
actor, a DDP rank, or nothing), `checkpoint` (where its checkpoints and
best weights are kept), `harness` (the frame around the training: device, GPU share, trial.log,
watchdog, traceback; `Progress`: each epoch to the journal, TensorBoard and the session),
`journal` (metrics.jsonl, tracebacks), `tb` (TensorBoard event files), `watchdog`
(`schedule.trial_timeout`), `settings` (the training section, typed), `gpu`, `memory`, and
`stored` (a trial of a sweep in object storage: its earlier files and newest checkpoint back).
Imports nothing from the other rooms of `tuner.trial`.
"""
