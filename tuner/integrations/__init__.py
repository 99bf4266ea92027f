"""Callbacks that let a training framework's own trainer be tuned as it is: Lightning's
`Trainer` (`tuner.integrations.lightning`) and Hugging Face's (`tuner.integrations.transformers`).

Each is imported only by code that uses it, and imports its framework then; what they share
(where a trial's metrics and checkpoints go, in `task.command` or `task.train`, and the RNG
state a checkpoint must carry for a resumed trial to go on exactly) is `bridge`.
"""
