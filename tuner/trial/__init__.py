"""One trial: everything that runs in a trial's processes (torch is imported only here).

The rooms, each importing only the rooms after it:

- `launch/`   how Ray runs a trial: the Tune trainable (the loop in the trial actor, or in
              ranks the actor starts itself, on one node or several) and a DDP trial's ranks.
- `userloop/` the user's own loop (`task.train`): `fn(config, ctx)` and its `ctx`.
- `script/`   the user's own script (`task.command`): a process per trial, its supervisor,
              and `tuner.report` / `checkpoint_dir` / `restore_dir`, which the script calls.
- `loop/`     tuner's own training loop (with or without the user's loss and metrics hooks)
              and its craft: data, models, optimizers, AMP, DDP/FSDP, prefetch, batch size,
              the memory probe, and the model rebuilt for export. `userloop/` offers its
              pieces through `ctx`.
- `frame/`    what every mode's trial shares: what it is told (`spec`), where it reports
              (`session`), where its checkpoints go, the frame around its training (`harness`:
              GPU share, log, watchdog, traceback), its journal and TensorBoard files.

`launch.loops` imports the chosen mode's function only when the trial starts, so the driver
never imports torch.
"""
