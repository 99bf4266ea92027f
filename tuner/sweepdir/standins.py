"""Stand-ins for a sweep's own task functions, for readers that never train (the report).

A sweep's user modules import from where it started; a report made elsewhere cannot find
them. `files.read_config(standins=True)` validates the sweep file with these in their place
(each takes the arguments its task field documents) and then puts the real names back.
Nothing ever calls them.
"""

from __future__ import annotations

from typing import Any, NoReturn


def _never() -> NoReturn:
    raise RuntimeError("a stand-in for a sweep's own function was called (see tuner.sweepdir.standins)")


def model(config: Any, input_shape: Any, num_classes: Any) -> NoReturn:
    _never()


def data(config: Any) -> NoReturn:
    _never()


def loss(output: Any, target: Any) -> NoReturn:
    _never()


def metrics(output: Any, target: Any) -> NoReturn:
    _never()


def train(config: Any, ctx: Any) -> NoReturn:
    _never()
