"""A sweep lets Tune keep as many trials pending as fit at once (resources.pending_trials), so
slots freed together fill together: Tune, given one of our searchers, would otherwise ask for
the next trial only once the one before it had its actor."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pytest

from tuner.driver.resources import PENDING_ENV, TrialResources, pending_trials

pytestmark = pytest.mark.usefixtures("ray_session")


def _one_cpu(max_concurrent: Optional[int] = None) -> TrialResources:
    return TrialResources(
        workers=1, cpus_per_worker=1, gpus_per_worker=0, bundle={"CPU": 1}, max_concurrent=max_concurrent
    )


def _added_and_started(pending: Optional[int], where: Path) -> list[str]:
    """What a two-trial run of a searcher of ours (a Searcher Tune did not build) on the
    session's Ray of 2 CPUs saw, in order: each trial asked of the searcher ("add 0"), each
    trial's actor started (Tune's on_trial_start: "start 0")."""
    from ray import tune
    from ray.tune.search import Searcher

    events: list[str] = []

    class Two(Searcher):
        def __init__(self) -> None:
            super().__init__(metric="loss", mode="min")
            self.given = 0

        def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
            if self.given == 2:
                return Searcher.FINISHED
            events.append(f"add {self.given}")
            self.given += 1
            return {"i": self.given - 1}

        def on_trial_complete(self, trial_id: str, result: Any = None, error: bool = False) -> None: ...

    class Order(tune.Callback):
        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            events.append(f"start {trial.config['i']}")

    def trainable(config: dict[str, Any]) -> None:
        tune.report({"loss": float(config["i"])})

    with pending_trials(_one_cpu()) as fits:
        assert fits == pending
        tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            tune_config=tune.TuneConfig(search_alg=Two(), num_samples=-1),
            run_config=tune.RunConfig(callbacks=[Order()], verbose=0, storage_path=str(where)),
        ).fit()
    return events


def test_tune_asks_for_both_trials_that_fit_before_the_first_has_its_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PENDING_ENV, raising=False)
    events = _added_and_started(2, tmp_path / "a")  # (the session's Ray: 2 CPUs, trials of 1)
    assert events.index("add 1") < events.index("start 0"), events
    # Tune's own default for our searchers, for the contrast: one pending at a time.
    monkeypatch.setenv(PENDING_ENV, "auto")
    events = _added_and_started(None, tmp_path / "b")
    assert events.index("start 0") < events.index("add 1"), events


def test_the_setting_is_the_sweeps_only_while_it_runs_and_never_overrides_a_limit_or_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PENDING_ENV, raising=False)
    with pending_trials(_one_cpu()) as fits:
        assert fits == 2 and os.environ[PENDING_ENV] == "2"
    assert PENDING_ENV not in os.environ
    # resources.max_concurrent_trials (or multi-worker trials): Tune takes it from the searcher's
    # ConcurrencyLimiter already.
    with pending_trials(_one_cpu(max_concurrent=1)) as fits:
        assert fits is None and PENDING_ENV not in os.environ
    monkeypatch.setenv(PENDING_ENV, "7")
    with pending_trials(_one_cpu()) as fits:
        assert fits is None and os.environ[PENDING_ENV] == "7"
    assert os.environ[PENDING_ENV] == "7"
