"""Searcher wrappers (imports Ray: loaded only when a sweep runs)."""

from __future__ import annotations

from typing import Any, Optional

import cloudpickle
from ray.tune.search import Searcher


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
