"""Searcher wrappers (imports Ray: loaded only when a sweep runs)."""

from __future__ import annotations

import time
from typing import Any, Optional

import cloudpickle
from ray.tune.search import SearchAlgorithm, Searcher, SearchGenerator


class ResumeFirst(Searcher):
    """Hands out the configurations of interrupted trials first, then the inner searcher's.

    Those trials continue from their checkpoints in their own directories; the inner
    searcher already knows their earlier results, so it is not told about them again.
    """

    def __init__(self, inner: Any, resumed: list[dict[str, Any]]):
        super().__init__(metric=inner.metric, mode=inner.mode)
        self.inner, self.queue, self.ours = inner, [dict(c) for c in resumed], set()

    def set_search_properties(
        self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any
    ) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> Optional[dict[str, Any]]:
        if self.queue:
            self.ours.add(trial_id)
            return self.queue.pop(0)
        return self.inner.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self.ours:
            self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        if trial_id not in self.ours:
            self.inner.on_trial_complete(trial_id, result=result, error=error)

    # HyperBandForBOHB tells the searcher when it pauses and resumes trials.
    def on_pause(self, trial_id: str) -> None:
        if trial_id not in self.ours and hasattr(self.inner, "on_pause"):
            self.inner.on_pause(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        if trial_id not in self.ours and hasattr(self.inner, "on_unpause"):
            self.inner.on_unpause(trial_id)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            cloudpickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(cloudpickle.load(f))


class OpenUntilDone(SearchAlgorithm):
    """A search algorithm that says it is finished only once every trial it made has ended.

    Tune evicts all cached trial actors as soon as the search algorithm is finished and no
    trial is staged; under HyperBand that is after the last configuration is handed out, so
    every promoted trial then resumed in a new process (measured: 4-5 s of idle slots per
    rung on 2 cores, most of a BOHB sweep's wall time). Staying open keeps one warm actor.
    """

    def __init__(self, inner: SearchAlgorithm):
        super().__init__()
        self.inner, self._open, self._stopped = inner, {}, False
        self._all_ended_since: Optional[float] = None

    @property
    def metric(self) -> Optional[str]:
        return self.inner.metric

    @property
    def searcher(self) -> Any:  # HyperBandForBOHB tells the searcher of pauses through this
        return self.inner.searcher

    @property
    def total_samples(self) -> int:
        return self.inner.total_samples

    def set_search_properties(
        self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any
    ) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def add_configurations(self, experiments: Any) -> None:
        self.inner.add_configurations(experiments)

    def next_trial(self) -> Any:
        trial = self.inner.next_trial()
        if trial is not None:
            self._open[trial.trial_id] = trial
        return trial

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        self._open.pop(trial_id, None)
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    def is_finished(self) -> bool:
        if not self.inner.is_finished():
            return False
        if self._stopped or not self._open:
            return True
        # Tune reports each trial's end through on_trial_complete. A trial's status alone is
        # no guide: a trial being paused shows TERMINATED for a moment. Should an end ever
        # go unreported, trials that all show an end state for over a second end it anyway.
        if all(t.is_finished() for t in self._open.values()):
            now = time.monotonic()
            if self._all_ended_since is None:
                self._all_ended_since = now
            return now - self._all_ended_since > 1.0
        self._all_ended_since = None
        return False

    def set_finished(self) -> None:
        self._stopped = True
        self.inner.set_finished()

    def has_checkpoint(self, dirpath: str) -> bool:
        return self.inner.has_checkpoint(dirpath)

    def save_to_dir(self, dirpath: str, **kwargs: Any) -> None:
        self.inner.save_to_dir(dirpath, **kwargs)

    def restore_from_dir(self, dirpath: str) -> None:
        self.inner.restore_from_dir(dirpath)

    def __getstate__(self) -> dict[str, Any]:  # trials are the controller's, not ours to save
        return {**self.__dict__, "_open": {}}


def open_until_done(search_alg: Any) -> OpenUntilDone:
    """`search_alg` (a Searcher or a SearchAlgorithm) kept open until its trials have ended."""
    return OpenUntilDone(SearchGenerator(search_alg) if isinstance(search_alg, Searcher) else search_alg)
