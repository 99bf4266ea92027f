"""The user's own script (`task.command`), run as a process per trial.

`run` (the trial: start the script, turn its reports into epochs and its checkpoint
directories into the trial's checkpoints), `process` (the running script seen from the trial
actor), `supervise` (run as a file: the processes that make sure no script outlives its
trial), `api` (what the script calls: `tuner.report`, `checkpoint_dir`, `restore_dir`;
standard library only). Imports `frame` only.
"""
