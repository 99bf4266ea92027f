"""training.autotune on a loader-bound task (issue 49, E1): the gain it prints is the gain its
trials then get. The data takes time to load but no CPU (each batch sleeps), and the model's
first step is slow, as a compile or cuDNN's benchmark makes a GPU's: while it runs, the
loader's workers fill their prefetch buffer, which a short timed window then reads as speed.
Both sides are measured rates on this machine, compared with each other: no speed assumed."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.test_loop import train
from tuner import autotune
from tuner.config import TrainingSection
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop import autotune as autotune_measure

pytestmark = pytest.mark.slow

MODULE = "autotune_steady_task"
SOURCE = """
import time
import torch
from torch.utils.data import Dataset

BATCH_S = 0.04  # a batch's loading time, whatever its size: a sleep, so no CPU is spent
FIRST_S = 0.5  # the first step of each model built: a compile, cuDNN's benchmark


class Slow(Dataset):
    num_classes = 2

    def __init__(self, n, delay):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.delay = delay

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, idx):  # the DataLoader's batched fetch: one wait a batch
        time.sleep(self.delay)
        return [(self.x[i], self.y[i]) for i in idx]


def data(config):
    return Slow(16 * 60, BATCH_S), Slow(64, 0.0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)
        self.first = True

    def forward(self, x):
        if self.first:
            time.sleep(FIRST_S)
            self.first = False
        return self.fc(x)


def model(config, input_shape, num_classes):
    return Net()
"""


def test_the_gain_autotune_prints_on_a_loader_bound_task_is_the_gain_its_trials_get(tmp_path: Path) -> None:
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    # One CPU: the loader arms are the file's 0 workers, 1 and 2; torch's threads have no other value.
    spec = TrialSpec(
        model=f"{MODULE}:model",
        data=f"{MODULE}:data",
        cpus_per_worker=1,
        max_epochs=3,
        search_path=str(tmp_path),
    )
    config = {**TrainingSection().model_dump(), "batch_size": 16, "lr": 1e-2, "threads": 1}
    task = {"task": {"model": spec.model, "data": spec.data}, "modules": {}}
    [raw] = autotune_measure.tune_sizes([config], spec, ["compile"], 300, task, {})
    result = autotune.Result.from_json(raw)
    changes = [a.change for a in result.arms]
    assert changes[:3] == ["reference", "loader_workers=1", "loader_workers=2"], changes
    assert result.choice.get("loader_workers") == 2, autotune.table_markdown(result)

    # The trials: the file's settings against the choice, 3 epochs each, each epoch a new pass
    # of the loader, as trials run. A trial's rate is its best epoch after the first (which
    # pays the slow first step): the machine's other work only ever slows an epoch.
    reference = train(tmp_path / "reference", spec, config)
    chosen = train(tmp_path / "chosen", spec, {**config, **result.choice})
    gain = _best(chosen) / _best(reference)
    assert result.speedup == pytest.approx(gain, rel=0.10), (gain, autotune.table_markdown(result))


def _best(session: Any) -> float:
    return max(m["samples_per_s"] for m in session.metrics[1:])
