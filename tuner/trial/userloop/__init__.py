"""The user's own loop (`task.train: "pkg.mod:fn"`, called as `fn(config, ctx)`).

`run` (the trial: the function called in the frame every mode shares), `context` (`ctx`: the
pieces of tuner's loop offered one by one, and `report`), `console` (the function runs in the
sweep's start directory; what it prints goes to trial.log). Imports `loop` and `frame`.
"""
