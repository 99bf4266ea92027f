"""Population-based training in a sweep (schedule.scheduler: pbt or pb2): the population's
state, the Tune scheduler that synchronises it and the searcher that hands out its members
(imports Ray: loaded only when a sweep runs).

A population is synchronous. Each member trains to the next perturbation epoch and waits
there, paused (its checkpoint of that epoch written, as every epoch's is); when every member
has reached it, or ended, the decisions are made (tuner.search.population: a function of the
members' values, their lineages and the seed) and carried out at once, while no member runs:
each recipient's checkpoint of the epoch is replaced by its donor's (trial/frame/clone.py),
its lineage.json gains a segment (the epoch, the new configuration, the donor), its Tune trial
gets the configuration, and the members go on. Waiting is what makes the sweep reproducible:
no decision depends on which trial happened to report first, so a sweep resumed after a kill
makes the same decisions as one that ran through, on a deterministic task.

Resuming: the population is read back from the trials' files (their records, journals,
lineages and newest checkpoints), and the perturbations are replayed: one every member had
reached is decided again (the same decisions), and any copy the kill cut short is made now,
before any member runs (a donor cannot have moved past the epoch before every copy of it was
made: the members go on only after). A member that waits at an epoch the others have not
reached yet is not handed out until they have (Tune starts a queued trial by itself, so the
searcher holds it back); each member continues in its own directory (`names`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from tuner.config.population import perturbation_epochs
from tuner.errors import warn
from tuner.results import records
from tuner.search.plan import TIME_ATTR, SearchPlan, SearchRequest, key
from tuner.search.population import Decision, Member, Rule, decide
from tuner.sweepdir import finite, read_lineage, read_record, write_lineage
from tuner.trial.frame import clone


class Place:
    """Where the population's files are: a local or shared sweep directory (`root`), or, for
    a sweep in object storage, the driver's mirror of it (read locally, written through to
    the bucket, where the trials' checkpoints are)."""

    def __init__(self, where: Any):
        # `where`: the sweep's place (tuner.sweepdir.place.Place), or None (nowhere).
        self.mirror = where if where is not None and where.remote else None
        self.root: Optional[str] = where.local if where is not None else None

    def write_lineage(self, name: str, lineage: dict[str, Any]) -> None:
        if self.root is None:
            return
        path = write_lineage(os.path.join(self.root, name), lineage)
        if self.mirror is not None:
            self.mirror.push(path)

    def checkpoint_epoch(self, name: str) -> Optional[int]:
        if self.mirror is not None:
            return clone.stored_checkpoint_epoch(self.mirror.fs, f"{self.mirror.key}/{name}")
        return clone.checkpoint_epoch(os.path.join(str(self.root), name))

    def copy(self, src: str, dst: str, epoch: int) -> None:
        if self.mirror is not None:
            key = self.mirror.key
            clone.copy_stored_checkpoint(self.mirror.fs, f"{key}/{src}", f"{key}/{dst}", epoch)
        elif self.root is not None:
            clone.copy_checkpoint(os.path.join(self.root, src), os.path.join(self.root, dst), epoch)


def rule_of(r: SearchRequest, kind: str, perturb: list[str]) -> Rule:
    pop, s = r.schedule.pbt, r.schedule
    return Rule(
        kind=kind,
        params=r.params,
        perturb=tuple(perturb),
        constraints=tuple(r.search.constraints),
        quantile=pop.quantile,
        resample=pop.resample,
        factor=pop.factor,
        shift=pop.shift,
        interval=pop.every(s.max_epochs),
        max_epochs=s.max_epochs,
        direction=r.direction,
        seed=r.search.seed,
    )


class Population:
    """The members, what each waits for, and the perturbations decided (see the module)."""

    def __init__(self, r: SearchRequest, rule: Rule, planned: list[tuple[dict[str, Any], str]], place: Place):
        self.rule, self.place, self.metric = rule, place, r.metric
        self.epochs = perturbation_epochs(rule.interval, rule.max_epochs)
        self.members = [
            Member(i, segments=[{"epoch": 0, "config": dict(c)}]) for i, (c, _) in enumerate(planned)
        ]
        self.origins = [origin for _, origin in planned]  # start_with, an earlier sweep's path, searcher
        self.decided: set[int] = set()  # perturbation epochs decided
        self.waiting: dict[int, int] = {}  # member -> the perturbation epoch it waits at
        self.to_hand: list[int] = list(range(len(planned)))  # members to start, in order
        self.handed: set[int] = set()
        self.of_trial: dict[str, int] = {}  # Tune trial id -> member
        self.trials: dict[int, Trial] = {}
        self.names: dict[str, str] = {}  # Tune trial id -> the directory it continues in
        self.origin_of: dict[str, str] = {}  # Tune trial id -> a new member's origin (SearchPlan.handed)
        self.lineage_written: set[int] = set()
        self.ended: set[int] = set()  # ended in an earlier run
        # resources.max_concurrent_trials (or what fits, for multi-worker trials): kept here,
        # not by Tune's ConcurrencyLimiter, which counts a paused member as running.
        self.limit = r.max_concurrent

    # ------------------------------------------------------------------ resume

    def read_back(self, r: SearchRequest) -> None:
        """The population as an earlier run left it (see the module)."""
        root = self.place.root
        if root is None or not os.path.isdir(root):
            return
        found = records(root, r.metric, r.direction, r.schedule.max_epochs, list(r.params))
        free = {i: key(m.segments[0]["config"]) for i, m in enumerate(self.members)}
        taken: list[tuple[int, Any]] = []
        for t in sorted(found, key=lambda t: (t.started or 0.0, t.trial_id)):
            lineage = read_lineage(t.path)
            # Its first configuration (lineage.json's, else the record's): its place in the plan.
            first = (
                lineage["segments"][0]["config"] if lineage else (read_record(t.path) or {}).get("config", {})
            )
            index = (lineage or {}).get("member")
            if not isinstance(index, int) or index not in free:
                index = next((i for i, k in free.items() if k == key(first)), None)
            if index is None:
                warn(f"{t.path}: a trial no member of the population starts as: left out of it")
                continue
            free.pop(index)
            m = self.members[index]
            m.name = os.path.basename(t.path)
            if lineage is not None:
                m.segments = list(lineage["segments"])
                self.lineage_written.add(index)
            m.values = _values(t.history, r.metric)
            taken.append((index, t))
        done = {i for i, t in taken if not t.to_run}
        self.ended |= done
        for m in self.members:
            m.ended = m.index in done
        started = [i for i, t in taken if t.to_run]
        self.to_hand = sorted(started) + sorted(i for i in range(len(self.members)) if i not in dict(taken))
        self.handed = set(done)
        self._replay({i: self.place.checkpoint_epoch(self.members[i].name) for i in started})

    def _replay(self, newest: dict[int, Optional[int]]) -> None:
        """Decide again every perturbation the members had all reached; the members waiting at
        the first one they had not all reached wait for it again."""
        for epoch in self.epochs:
            reached = {
                m.index
                for m in self.members
                if epoch in m.values and (m.index in self.ended or (newest.get(m.index) or 0) >= epoch)
            }
            present = {m.index for m in self.members if m.name}
            unfinished_elsewhere = [
                i for i in range(len(self.members)) if i not in reached and not self._gone_before(i, epoch)
            ]
            if unfinished_elsewhere or not present:
                for i in reached - self.ended:
                    if newest.get(i) == epoch:
                        self.waiting[i] = epoch
                return
            self._perturb(epoch)

    def _gone_before(self, i: int, epoch: int) -> bool:
        """Member i ended (an earlier run) before reaching `epoch`."""
        m = self.members[i]
        return i in self.ended and epoch not in m.values

    # ------------------------------------------------------------------ the live sweep

    def hand_out(self, trial_id: str) -> Any:
        """The next member to start (its configuration), None while those left wait for the
        others, Searcher.FINISHED when every member has been handed out."""
        left = [i for i in self.to_hand if i not in self.handed]
        if not left:
            return Searcher.FINISHED
        ready = [i for i in left if i not in self.waiting]
        if not ready or self.full():
            return None
        i = ready[0]
        self.handed.add(i)
        self.of_trial[trial_id] = i
        m = self.members[i]
        if m.name:
            self.names[trial_id] = m.name  # (its record has its origin)
        else:
            self.origin_of[trial_id] = self.origins[i]
        return dict(m.config)

    def added(self, trial: Trial) -> None:
        """A Tune trial of a member exists (it may fail before it reports anything)."""
        i = self.of_trial.get(trial.trial_id)
        if i is not None:
            self.trials[i] = trial

    def result(self, trial: Trial, result: dict[str, Any]) -> str:
        i = self.of_trial.get(trial.trial_id)
        if i is None:
            return TrialScheduler.CONTINUE
        m = self.members[i]
        m.name = m.name or _name(trial)
        self.trials[i] = trial
        epoch = int(result.get(TIME_ATTR) or 0)
        value = result.get(self.metric)
        if "failure" in result or not finite(value):
            return TrialScheduler.CONTINUE  # it ends itself (diverged, oom): out of the population
        m.values[epoch] = float(value)
        if epoch not in self.epochs or epoch in self.decided:
            return TrialScheduler.CONTINUE
        self.waiting[i] = epoch
        self.advance()
        if epoch in self.decided and not any(s.get("epoch") == epoch for s in m.segments[1:]):
            return TrialScheduler.CONTINUE  # the last to arrive, and it keeps its own weights
        return TrialScheduler.PAUSE

    def advance(self) -> None:
        """Carry out the next perturbation once every member has reached it or ended."""
        for epoch in self.epochs:
            if epoch in self.decided:
                continue
            if all(self._ended(i) or self.waiting.get(i) == epoch for i in range(len(self.members))):
                self._perturb(epoch)
            return

    def _ended(self, i: int) -> bool:
        if i in self.ended:
            return True
        trial = self.trials.get(i)
        return trial is not None and trial.status in (Trial.TERMINATED, Trial.ERROR)

    def _perturb(self, epoch: int) -> None:
        generation = self.epochs.index(epoch) + 1
        before = [self._as_of(m, epoch) for m in self.members]
        for d in decide(self.rule, generation, epoch, before):
            self._carry_out(d, epoch, generation)
        for m in self.members:  # every member's file names its place in the population
            if m.name and m.index not in self.lineage_written:
                self._write(m)
        self.decided.add(epoch)
        self.waiting = {i: e for i, e in self.waiting.items() if e != epoch}

    def _as_of(self, m: Member, epoch: int) -> Member:
        """Member m as the perturbation at `epoch` saw it: its segments before, live if it has
        a value there."""
        segments = [s for s in m.segments if int(s["epoch"]) < epoch] or m.segments[:1]
        return Member(m.index, m.name, segments, dict(m.values), ended=epoch not in m.values)

    def _carry_out(self, d: Decision, epoch: int, generation: int) -> None:
        m, donor = self.members[d.member], self.members[d.donor]
        done = next((s for s in m.segments if int(s["epoch"]) == epoch), None)
        if done is not None:  # made before a kill: the replay agrees, or says so
            if done.get("donor") != donor.name:
                warn(f"{m.name}: its lineage at epoch {epoch} names {done.get('donor')}, not {donor.name}")
            return
        try:
            self.place.copy(donor.name, m.name, epoch)
        except (OSError, clone.NoCheckpoint) as err:
            warn(f"population: {m.name} keeps its own weights at epoch {epoch}: {err}")
            return
        m.segments.append(
            {
                "epoch": epoch,
                "config": d.config,
                "donor": donor.name,
                "donor_member": donor.index,
                "generation": generation,
                "value": d.value,
                "donor_value": d.donor_value,
                "time": round(time.time(), 3),
            }
        )
        self._write(m)
        trial = self.trials.get(m.index)
        if trial is not None:
            trial.set_config(dict(d.config))

    def _write(self, m: Member) -> None:
        self.place.write_lineage(m.name, {"member": m.index, "segments": m.segments})
        self.lineage_written.add(m.index)

    def full(self) -> bool:
        """As many members run (or are about to) as the sweep lets run at once."""
        busy = (Trial.RUNNING, Trial.PENDING)
        return self.limit is not None and sum(t.status in busy for t in self.trials.values()) >= self.limit

    def runnable(self, trial: Trial) -> bool:
        i = self.of_trial.get(trial.trial_id)
        return i is None or i not in self.waiting


def _name(trial: Trial) -> str:
    return os.path.basename(trial.path.rstrip("/"))


def _values(history: list[dict[str, Any]], metric: str) -> dict[int, float]:
    return {
        int(row["epoch"]): float(row[metric])
        for row in history
        if "failure" not in row and finite(row.get(metric))
    }


class PopulationScheduler(FIFOScheduler):
    """Tune's side of a population: pauses each member at every perturbation epoch until the
    others are there, and starts paused members only once the perturbation is carried out."""

    def __init__(self, population: Population, metric: str, direction: str, title: str):
        super().__init__()
        self.population, self.title = population, title
        self._metric, self._mode, self._time_attr = metric, direction, TIME_ATTR  # (Ray's names)

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec: Any) -> bool:
        return True  # (its own, from the sweep)

    @property
    def supports_buffered_results(self) -> bool:
        return False  # every epoch's result is seen as it comes: a member waits at its epoch

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self.population.added(trial)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        return self.population.result(trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        self.population.advance()

    def choose_trial_to_run(self, tune_controller: Any) -> Optional[Trial]:
        self.population.advance()  # (a member that failed for good is ERROR only after on_trial_error)
        trials = tune_controller.get_trials()
        for trial in trials:
            if trial.status == Trial.PENDING:
                return trial
        if self.population.full():
            return None
        paused = [t for t in trials if t.status == Trial.PAUSED and self.population.runnable(t)]
        by_member = self.population.of_trial
        paused.sort(key=lambda t: by_member.get(t.trial_id, 0))
        return paused[0] if paused else None

    def debug_string(self) -> str:
        return f"{self.title}: perturbed at epochs {sorted(self.population.decided)}"


class PopulationSearcher(Searcher):
    """Hands out the population's members (new ones with their planned configurations;
    resumed ones with the configuration they run with now, in their own directories)."""

    def __init__(self, population: Population, metric: str, direction: str):
        super().__init__(metric=metric, mode=direction)
        self.population = population

    def set_search_properties(
        self, metric: Optional[str], mode: Optional[str], config: dict, **spec: Any
    ) -> bool:
        return True

    def suggest(self, trial_id: str) -> Any:
        return self.population.hand_out(trial_id)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        pass

    def save(self, checkpoint_path: str) -> None:  # the trials' files are the state (resume reads them)
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass


def _build(r: SearchRequest, kind: str) -> PopulationScheduler:
    from tuner.search.algorithms import random_todo

    rule = rule_of(r, kind, list(r.schedule.pbt.perturb or []))  # (resolved at load)
    population = Population(r, rule, random_todo(r), Place(r.place))
    population.read_back(r)
    title = r.scheduler.title if r.scheduler is not None else kind
    return PopulationScheduler(population, r.metric, r.direction, title)


def pbt(r: SearchRequest) -> PopulationScheduler:
    """Population-based training (schedule.pbt's explore)."""
    return _build(r, "pbt")


def pb2(r: SearchRequest) -> PopulationScheduler:
    """Population-based bandits: numeric parameters chosen by GP-UCB."""
    return _build(r, "pb2")


def hand_out(plan: SearchPlan, r: SearchRequest, scheduler: PopulationScheduler) -> SearchPlan:
    """The plan with the population's own searcher (see the module)."""
    population = scheduler.population
    left = [i for i in population.to_hand if i not in population.handed]
    plan.search_alg = PopulationSearcher(population, r.metric, r.direction)
    plan.num_samples = len(left)
    plan.points = None
    plan.names = population.names
    plan.handed = population.origin_of
    return plan
