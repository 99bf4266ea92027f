"""`tracking`: every trial as a run of an experiment tracker (`tracking.mlflow`, `tracking.wandb`).

One Tune callback in the driver per tracker, each a `Tracking`: a run per trial (its
configuration, per-epoch metrics with the epoch as step, FINISHED or FAILED at the end, the
trial's failure), continued when the trial is (paused and started again, `resume`), the sweep's
own identity kept in the sweep directory so that `resume` and `extend` log beside the same runs.
What differs between trackers (how a run is opened, logged to and ended) is a subclass's; the
rest, and the rule below, is here once. Imports Ray; each tracker imports its library only when
a sweep that asks for it runs (`callbacks`).

Tracking never ends a sweep: a tracker's first failure is a warning, and the rest of this run is
not logged to it (each call would wait on the store again); the sweep's own files have it all.
A driver killed outright loses the calls it had queued; the sweep's next run (`resume`,
`extend`) brings the tracker up to the sweep's own record of the trials that ended meanwhile
(`close_earlier`): their runs ended as the trials did, and a trial the tracker never heard of
logged from its journal.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Optional

from ray.tune import Callback

from tuner.config.schedule import redacted
from tuner.driver.callbacks import trial_name
from tuner.errors import warn
from tuner.sweepdir.files import (
    MLFLOW_RUN_FILE,
    WANDB_ENDED_FILE,
    WANDB_OPEN_FILE,
    WANDB_RUN_FILE,
    finite,
    read_record,
)
from tuner.sweepdir.place import Place

if TYPE_CHECKING:
    from tuner.config import SweepConfig
    from tuner.results import TrialRecord

# What every Tune result holds beside the trial's own numbers.
_TUNE_KEYS = {
    "timestamp", "time_this_iter_s", "time_total_s", "training_iteration", "pid", "time_since_restore",
    "iterations_since_restore", "done", "epoch", "wall_time",
}  # fmt: skip
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"
Logged = tuple[int, float, dict[str, float], Optional[str]]  # (step, time, numbers, failure)


def logged(result: Mapping[str, Any]) -> Optional[Logged]:
    """What a tracker logs of a trial's result (Tune's, or a row of the trial's journal): the
    epoch as its step, its time, its finite numbers and its failure; None when it has none."""
    step = int(result.get("epoch") or result.get("training_iteration") or 0)
    stamp = float(result.get("wall_time") or time.time())
    numbers = {k: float(v) for k, v in result.items() if k not in _TUNE_KEYS and finite(v)}
    failure = str(result["failure"]) if result.get("failure") else None
    return (step, stamp, numbers, failure) if numbers or failure else None


def ended_as(trial: TrialRecord) -> str:
    """The status a trial's run ends with, by the sweep's record of the trial."""
    return FAILED if trial.outcome.failed else FINISHED


def callbacks(cfg: SweepConfig, place: Place) -> list[Callback]:
    """A tracker for each one the sweep's `tracking` section names; `place`: where the sweep
    lives (its tracker ids are kept there)."""
    found: list[Callback] = []
    for field, build in TRACKERS.items():
        section = getattr(cfg.tracking, field)
        if section is not None:
            found.append(build(section, cfg.name, place))
    return found


class Tracking(Callback):
    """A tracker as Tune sees it; a subclass says how its runs are opened, logged and ended.

    Tune's hooks only take down what a call needs and queue it: the tracker's calls (a store's
    round trips, W&B's start of a run) run in order in a thread of the tracker's own, never in
    Tune's loop, where they held up every trial's next result and next start. The sweep's end
    waits for them all."""

    field = "tracking"  # the sweep file's field, as warnings name it
    product = "the tracker"

    def __init__(self, sweep_name: str, place: Place):
        self.sweep_name, self.place = sweep_name, place
        self.sweep_dir = place.local  # its working copy (a tracker's own local files go there)
        self.runs: dict[str, Any] = {}  # Tune trial id -> the tracker's run (the thread's own)
        self.failed = False
        self._calls: queue.SimpleQueue[Optional[Callable[[], None]]] = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def __getstate__(self) -> dict[str, Any]:  # (Tune pickles its callbacks: the queue and thread stay)
        return {k: v for k, v in self.__dict__.items() if k not in ("_calls", "_thread")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _calls=queue.SimpleQueue(), _thread=None)

    # ------------------------------------------------------------------ a tracker's own

    @property
    def what(self) -> str:
        """The tracker as a warning names it (never with credentials)."""
        return self.product

    def bounded(self) -> AbstractContextManager[Any]:
        """Around every call: how long the tracker may take (its own retries bounded)."""
        return nullcontext()

    def one_line(self, err: BaseException) -> str:
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"

    def start(self) -> None:
        """Open the tracker for the sweep (once per run of it)."""

    def open(self, config: dict[str, Any], name: str) -> Any:
        """The run of the trial with directory name `name` and configuration `config`: new, or
        the one it had (a trial continued)."""
        raise NotImplementedError

    def log(
        self, run: Any, step: int, stamp: float, metrics: dict[str, float], failure: Optional[str]
    ) -> None:
        raise NotImplementedError

    def close(self, run: Any, status: str) -> None:
        """End a trial's run: FINISHED, FAILED, or KILLED (cut off; `resume` continues it)."""
        raise NotImplementedError

    def end(self, interrupted: bool) -> None:
        """The sweep's run ended (interrupted: trials were cut off)."""

    def close_earlier(self, ended: Mapping[str, TrialRecord]) -> None:
        """Bring the tracker up to the trials an earlier run of the sweep ended (`ended`: trial
        directory name -> its record): a run left open ends as its trial did (`ended_as`), a
        trial the tracker never heard of (its calls were queued when that run's driver was
        killed) is logged from its journal (`replay`); any other run stays as it is."""

    def replay(self, name: str, trial: TrialRecord, run: Any = None, after: int = 0) -> None:
        """Log trial `name` from its journal (the epochs after `after`) and end its run as it
        ended: in `run`, or in the one `open` gives (a new run, with the trial's configuration).
        A trial Tune never started has no run, as in the run of the sweep that ended it."""
        if run is None and trial.never_started:
            return
        if run is None:
            run = self.open(dict((read_record(trial.path) or {}).get("config") or {}), name)
        for row in trial.history:
            found = logged(row)
            if found is not None and found[0] > after:
                self.log(run, *found)
        self.close(run, ended_as(trial))

    # ------------------------------------------------------------------ the tracker's thread

    def _later(self, call: Callable[..., None], *args: Any) -> None:
        """`call(*args)` in the tracker's thread, after every call queued before it. The
        tracker's first failure is a warning, and no call after it is made: tracking never
        ends a sweep (nor does it raise into Tune, which would)."""
        if self.failed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"tuner {self.field}", daemon=True)
            self._thread.start()
        self._calls.put(functools.partial(self._guarded, call, *args))

    def _guarded(self, call: Callable[..., None], *args: Any) -> None:
        if self.failed:
            return
        try:
            with self.bounded():
                call(*args)
        except Exception as err:  # noqa: BLE001 - the tracker's failure is never the sweep's
            self.failed = True
            warn(
                f"{self.field}: {self.what} failed: {self.one_line(err)}; the sweep goes on, no "
                f"longer logged to {self.product} (its own files have every result)"
            )

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    def flush(self) -> None:
        """Wait until every call queued so far has been made (each one bounded: `bounded`)."""
        if self._thread is not None:
            self._calls.put(None)
            self._thread.join()
            self._thread = None

    def _run(self, trial_id: str, name: str, config: dict[str, Any]) -> Any:
        if trial_id not in self.runs:
            self.runs[trial_id] = self.open(config, name)
        return self.runs[trial_id]

    def _result(self, trial_id: str, name: str, config: dict[str, Any], *logged: Any) -> None:
        self.log(self._run(trial_id, name, config), *logged)

    def _end(self, trial_id: str, status: str) -> None:
        run = self.runs.pop(trial_id, None)
        if run is not None:  # (a trial removed before it started has no run)
            self.close(run, status)

    def _finish(self) -> None:
        # Trials Tune tore down on Ctrl-C never completed: their runs (and the sweep's) are
        # KILLED, to be continued by `tuner resume`.
        unfinished = list(self.runs.values())
        for run in unfinished:
            self.close(run, KILLED)
        self.runs.clear()
        self.end(interrupted=bool(unfinished))

    # ------------------------------------------------------------------ Tune's hooks

    def setup(self, **info: Any) -> None:
        self._later(self.start)

    def ended_earlier(self, ended: Mapping[str, TrialRecord]) -> None:
        # (CatchUp: trials an earlier run of the sweep ended, its driver killed before the
        # tracker heard: their runs are never left running. A trial to be continued keeps its
        # run, which `open` continues.)
        self._later(self.close_earlier, dict(ended))

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._later(self._run, trial.trial_id, trial_name(trial), dict(trial.config))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        found = logged(result)
        if found is not None:
            self._later(self._result, trial.trial_id, trial_name(trial), dict(trial.config), *found)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._later(
            self._end, trial.trial_id, FAILED if (trial.last_result or {}).get("failure") else FINISHED
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._later(self._end, trial.trial_id, FAILED)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self._later(self._finish)
        self.flush()


def sweep_key(place: Place, name: str, new: Callable[[], str]) -> tuple[str, bool]:
    """(the sweep's id with a tracker, kept in the sweep's file `name`, whether it was there
    before); `new()` makes one for a sweep that has none yet."""
    found = (place.read(name) or "").strip()
    if found:
        return found, True
    key = new()
    place.write(name, key + "\n")
    return key, False


# ----------------------------------------------------------------------------- MLflow

TRIAL_TAG, SWEEP_TAG, PARENT_TAG = "tuner.trial", "tuner.sweep_dir", "mlflow.parentRunId"


class MLflowTracking(Tracking):
    """`tracking.mlflow`: a parent run per sweep (its id in MLFLOW_RUN_FILE), a child run per
    trial nested under it (params = the trial's configuration, the trial's outcome as a tag).
    The store was checked before Ray started (mlflow_store.check); each call here is bounded
    the same way (mlflow_store.brief)."""

    field, product = "tracking.mlflow", "MLflow"

    def __init__(self, uri: str, experiment: str, sweep_name: str, place: Place):
        super().__init__(sweep_name, place)
        self.uri, self.experiment = uri, experiment

    @property
    def what(self) -> str:
        # A server's scheme and host (its URL may carry credentials), a database's scheme.
        uri = self.uri
        where = redacted(uri) if uri.startswith(("http://", "https://")) else uri.partition(":")[0]
        return f"the MLflow store ({where})"

    def bounded(self) -> AbstractContextManager[Any]:
        from tuner.driver.mlflow_store import brief

        return brief()

    def one_line(self, err: BaseException) -> str:
        from tuner.driver.mlflow_store import one_line

        return one_line(err)

    def start(self) -> None:
        from tuner.driver.mlflow_store import no_telemetry

        no_telemetry()
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(self.experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)

        def new() -> str:
            run = self.client.create_run(
                self.experiment_id, run_name=self.sweep_name, tags={SWEEP_TAG: self.place.uri}
            )
            return str(run.info.run_id)

        self.parent, earlier = sweep_key(self.place, MLFLOW_RUN_FILE, new)
        if earlier:
            self.client.update_run(self.parent, status="RUNNING")

    def close_earlier(self, ended: Mapping[str, TrialRecord]) -> None:
        query = f"tags.`{PARENT_TAG}` = '{self.parent}'"
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=50000)
        heard = {r.data.tags.get(TRIAL_TAG, ""): r for r in runs}
        for name, trial in sorted(ended.items()):
            run = heard.get(name)
            if run is None:
                self.replay(name, trial)
            elif run.info.status == "RUNNING":  # (its epochs after the last one the store has)
                self.replay(name, trial, run.info.run_id, self._last_step(run.info.run_id, trial))

    def _last_step(self, run_id: str, trial: TrialRecord) -> int:
        """The last epoch of `trial` the store has in its run (by the first number its journal
        logs): a killed driver's queued results never reached it."""
        for row in trial.history:
            found = logged(row)
            if found is not None and found[2]:
                history = self.client.get_metric_history(run_id, next(iter(found[2])))
                return max((m.step for m in history), default=0)
        return 0

    def open(self, config: dict[str, Any], name: str) -> str:
        from mlflow.entities import Param

        earlier = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.parent}' and tags.`{TRIAL_TAG}` = '{name}'",
            max_results=1,
        )
        if earlier:  # a trial continued by resume, or paused and started again
            run_id = str(earlier[0].info.run_id)
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        run_id = str(
            self.client.create_run(
                self.experiment_id, run_name=name, tags={PARENT_TAG: self.parent, TRIAL_TAG: name}
            ).info.run_id
        )
        params = [Param(k, str(v)[:6000]) for k, v in sorted(config.items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(run_id, params=params[i : i + 100])
        return run_id

    def log(
        self, run: Any, step: int, stamp: float, metrics: dict[str, float], failure: Optional[str]
    ) -> None:
        from mlflow.entities import Metric, RunTag

        ms = int(1000 * stamp)
        self.client.log_batch(
            run,
            metrics=[Metric(k, v, ms, step) for k, v in metrics.items()],
            tags=[RunTag("tuner.failure", failure)] if failure else [],
        )

    def close(self, run: Any, status: str) -> None:
        self.client.set_terminated(run, status=status)

    def end(self, interrupted: bool) -> None:
        self.client.set_terminated(self.parent, status=KILLED if interrupted else FINISHED)


# ----------------------------------------------------------------------------- W&B


class WandbTracking(Tracking):
    """`tracking.wandb`: a W&B run per trial, in the sweep's group (job type `trial`), its
    config the trial's configuration, every reported number logged with `epoch` as its step
    metric (so a resumed trial's epochs fall in place), its outcome in the summary
    (`tuner_status`, `tuner_failure`). The run's id is the sweep's prefix (WANDB_RUN_FILE) and
    the trial's directory name, so a trial continued later continues its run; the trials whose
    runs are open are listed in WANDB_OPEN_FILE, those whose runs ended in WANDB_ENDED_FILE,
    for the next run of the sweep to end the runs of trials that ended while a killed driver
    could not, and to log those it never heard of (`close_earlier`). W&B's own files
    go under the sweep directory (`wandb/`, unless WANDB_DIR says otherwise). W&B is told not
    to record the driver's console, command line, git remote or machine (the command line may
    hold a webhook's credentials): the sweep's environment.json has its versions and commit."""

    field, product = "tracking.wandb", "W&B"

    def __init__(self, section: Any, sweep_name: str, place: Place):
        super().__init__(sweep_name, place)
        self.section = section

    def start(self) -> None:
        import uuid

        import wandb

        self.wandb = wandb

        def new() -> str:
            self.place.write(WANDB_ENDED_FILE, "")  # (none yet; before the prefix, which says "begun")
            return uuid.uuid4().hex[:8]

        self.prefix, _ = sweep_key(self.place, WANDB_RUN_FILE, new)
        # The trials whose runs an earlier run of the sweep opened and never ended, and those
        # whose runs it ended (W&B cannot be asked which runs there are without its server).
        # A sweep begun by a tuner that kept no list of ended runs: None, its runs as they are.
        self.open_names = set((self.place.read(WANDB_OPEN_FILE) or "").split())
        ended = self.place.read(WANDB_ENDED_FILE)
        self.ended_names: Optional[set[str]] = None if ended is None else set(ended.split())
        wanted = {
            "console": "off",
            "disable_git": True,
            "save_code": False,
            "silent": True,
            "x_disable_meta": True,
            "x_disable_stats": True,  # (the driver machine's load, not a trial's)
            "x_save_requirements": False,
        }
        known = getattr(wandb.Settings, "model_fields", wanted)  # (older W&B lacks a few)
        self.settings = wandb.Settings(**{k: v for k, v in wanted.items() if k in known})

    def _opened(self, name: str, is_open: bool) -> None:
        """Keep the sweep's list of trials with a run open (WANDB_OPEN_FILE) in step."""
        if (name in self.open_names) != is_open:
            self.open_names ^= {name}
            self._list(WANDB_OPEN_FILE, self.open_names)

    def _list(self, file: str, names: set[str]) -> None:
        """One of the sweep's lists of trial names (WANDB_OPEN_FILE, WANDB_ENDED_FILE)."""
        self.place.write(file, "".join(f"{n}\n" for n in sorted(names)))

    def open(self, config: dict[str, Any], name: str) -> Any:
        return self._init(name, config)

    def _init(self, name: str, config: dict[str, Any]) -> Any:
        s = self.section
        self._opened(name, True)  # (first: a driver killed in between leaves it listed)
        run = self.wandb.init(
            project=s.project or self.sweep_name,
            entity=s.entity,
            group=s.group or self.sweep_name,
            job_type="trial",
            name=name,
            id=f"{self.prefix}-{name}",
            resume="allow",  # a trial continued (paused, `resume`) logs on in its run
            reinit="create_new",  # one run per running trial, side by side in the driver
            config=config,
            tags=list(s.tags) or None,
            mode=s.mode,
            dir=os.environ.get("WANDB_DIR") or self.sweep_dir,
            settings=self.settings,
        )
        run.define_metric("*", step_metric="epoch")
        return run

    def log(
        self, run: Any, step: int, stamp: float, metrics: dict[str, float], failure: Optional[str]
    ) -> None:
        run.log({"epoch": step, **metrics})
        if failure:
            run.summary["tuner_failure"] = failure

    def close(self, run: Any, status: str) -> None:
        run.summary["tuner_status"] = status.lower()
        if status == KILLED:
            run.mark_preempting()  # cut off, to be continued by `tuner resume`
        run.finish(exit_code=0 if status == FINISHED else 1)
        name = run.id[len(self.prefix) + 1 :]
        if self.ended_names is not None and name not in self.ended_names:
            self.ended_names.add(name)
            self._list(WANDB_ENDED_FILE, self.ended_names)
        self._opened(name, False)

    def close_earlier(self, ended: Mapping[str, TrialRecord]) -> None:
        heard = set(ended) if self.ended_names is None else self.ended_names | self.open_names
        for name, trial in sorted(ended.items()):
            if name in self.open_names:
                self.close(self._init(name, {}), ended_as(trial))  # (resumed to be ended: the same run)
            elif name not in heard:
                self.replay(name, trial)

    def end(self, interrupted: bool) -> None:
        self.wandb.teardown()  # W&B's service process ends with the sweep's run


def _mlflow(section: Any, sweep_name: str, place: Place) -> Tracking:
    return MLflowTracking(section.uri, section.experiment or sweep_name, sweep_name, place)


# The sweep file's `tracking.<field>` -> its tracker, built when a sweep that asks for it runs.
TRACKERS: dict[str, Callable[[Any, str, Place], Tracking]] = {"mlflow": _mlflow, "wandb": WandbTracking}
