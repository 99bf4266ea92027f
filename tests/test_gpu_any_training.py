"""Any training on a CUDA GPU (issue 12): the loss/metrics hooks and the user's own loop under
AMP, as trials run them (no Ray: LocalSession). Skipped without a CUDA GPU."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ROOT
from tuner.config import TrainingSection
from tuner.trial.frame.session import LocalSession
from tuner.trial.frame.spec import TrialSpec
from tuner.trial.loop.run import run_trial
from tuner.trial.userloop.run import run_own_loop

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _hp(**kw: Any) -> dict[str, Any]:
    return {**TrainingSection().model_dump(), **kw}


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_hooks_train_a_regression_under_amp_on_the_gpu(tmp_path: Path, amp: str) -> None:
    mod = "search_spaces.regression"
    spec = TrialSpec(
        model=f"{mod}:model", data=f"{mod}:data", loss=f"{mod}:loss", metrics=f"{mod}:metrics",
        metric="val_mse", direction="min", max_epochs=6, gpus_per_worker=1.0, search_path=str(ROOT),
    )  # fmt: skip
    session = LocalSession(str(tmp_path), metric="val_mse")
    run_trial(_hp(amp=amp, lr=3e-3, width=64, depth=2, optimizer="adamw", batch_size=32), spec, session)
    rows = session.metrics
    assert len(rows) == 6 and all("failure" not in r for r in rows), rows[-1]
    mse = [r["val_mse"] for r in rows]
    assert all(math.isfinite(v) for v in mse)
    # Well below always predicting the training mean (computed here from the same split).
    from search_spaces.regression import data

    train, val = data({})
    baseline = float(((val.tensors[1] - train.tensors[1].mean()) ** 2).mean())
    assert min(mse) < 0.8 * baseline, (mse, baseline)
    assert rows[-1]["gpu_mem_peak_gb"] > 0  # it ran on the GPU


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_an_own_loop_trains_on_the_gpu_under_amp_and_resumes(tmp_path: Path, amp: str) -> None:
    spec = TrialSpec(
        model="", data="", trial_mode="train", train="search_spaces.char_lm:train", metric="val_loss",
        direction="min", max_epochs=2, gpus_per_worker=1.0, search_path=str(ROOT),
    )  # fmt: skip
    hp = _hp(amp=amp, lr=2e-3, width=64, layers=2, heads=4, block_size=64, dropout=0.0, batch_size=64,
             modules="argparse", chars=60_000)  # fmt: skip
    first = LocalSession(str(tmp_path), metric="val_loss")
    run_own_loop(hp, spec, first)
    assert [r["epoch"] for r in first.metrics] == [1, 2]
    assert all(math.isfinite(r["val_loss"]) and "failure" not in r for r in first.metrics)
    assert first.metrics[-1]["val_loss"] < math.log(100)  # below a uniform guess over the characters
    # Resumed for two more epochs: it continues from its checkpoint, on the GPU.
    more = TrialSpec(**{**spec.to_dict(), "max_epochs": 4})
    again = LocalSession(str(tmp_path), resume=True, metric="val_loss")
    run_own_loop(hp, more, again)
    assert [r["epoch"] for r in again.metrics] == [3, 4]
    assert again.metrics[-1]["val_loss"] <= first.metrics[-1]["val_loss"] + 0.05
