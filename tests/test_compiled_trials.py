"""Compiled trials on CPU: what a reused actor's later trials and a compiling process get
(issue 31: Dynamo's cache reset when a trial ends, Inductor's compile workers per trial CPU,
and a built-in model, an nn.Sequential, compiled at all)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.test_loop import hp, train
from tuner.trial.frame.spec import TrialSpec

pytestmark = pytest.mark.slow

MODULE = "compiled_trials_model"  # one class, so every trial's forward is the same code object
SOURCE = """
import torch

TRACED = []  # one entry per forward run eagerly or traced by Dynamo (then True)


class Net(torch.nn.Module):
    def __init__(self, features, width, classes):
        super().__init__()
        self.a, self.b = torch.nn.Linear(features, width), torch.nn.Linear(width, classes)

    def forward(self, x):
        TRACED.append(torch.compiler.is_compiling())
        return self.b(torch.relu(self.a(x)))


def model(config, input_shape, num_classes):
    return Net(input_shape[0], config["width"], num_classes)
"""
DATA = {"samples": 100, "features": 8, "classes": 3}


def test_a_compiled_trial_past_dynamos_recompile_limit_in_a_reused_actor_still_runs_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    spec = TrialSpec(
        model=f"{MODULE}:model", data="synthetic", data_args=DATA, max_epochs=1, search_path=str(tmp_path)
    )
    # Dynamo's backend only, for speed: its cache and its recompile limit (graphs per code
    # object) are the same whichever backend compiles the graph.
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager"}))
    # The limit at 2 instead of Dynamo's 8: the same cache and the same fall-back to eager past
    # it, met by the 4th trial instead of the 10th (a trial's graphs are traced in seconds).
    # (Dynamo's own patch: monkeypatch's undo hides a key of Dynamo's config module for good.)
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    with torch._dynamo.config.patch({limit: 2}):
        # 4 trials of one process, one model size each: each its own graph of the same forward.
        for width in range(8, 12):
            if MODULE in sys.modules:
                sys.modules[MODULE].TRACED.clear()
            train(tmp_path / f"w{width}", spec, hp(width=width, compile=True, batch_size=50))
    traced = sys.modules[MODULE].TRACED
    # A compiled forward appends when Dynamo traces it (True), then runs its graph; past the
    # recompile limit it runs eagerly and appends False at every call.
    assert True in traced, f"the 4th trial ran eager: {traced}"


def test_a_compiled_built_in_model_is_compiled_with_compile_workers_for_its_cpus_only(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("Inductor compiles in-process on one CPU anyway")
    # A fresh process (Inductor's pool lives as long as its process), as a trial actor is.
    script = f"""
        import psutil, torch
        from pathlib import Path
        from tests.test_loop import hp, train
        from tuner.trial.frame.spec import TrialSpec
        spec = TrialSpec(model="mlp", data="synthetic", data_args={DATA!r}, max_epochs=1, cpus_per_worker=1)
        train(Path({str(tmp_path)!r}), spec, hp(width=8, depth=1, compile=True, batch_size=50))
        import torch._inductor.config as inductor
        from torch._dynamo.utils import counters
        children = psutil.Process().children(recursive=True)
        print(counters["frames"]["ok"], len(children), inductor.compile_threads)
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    frames, children, threads = out.stdout.split()[-3:]
    # The built-in model (an nn.Sequential) was compiled: Dynamo compiled frames of it.
    assert int(frames) > 0, out.stdout
    # Inductor's own setting, what it sizes its pool of compile processes by (the node's
    # CPUs unless told), and no process of the pool left running.
    assert (int(threads), int(children)) == (1, 0), out.stdout


def test_every_batch_shape_gets_a_static_graph_and_full_batches_keep_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 80 training samples in steps of 32 (the last of 16), 20 validation samples in chunks of
    # 7 (the last of 6): shapes that change within every epoch. Issue 49, E8: left to Dynamo,
    # the second size seen turns the training graph dynamic in the batch, and every full batch
    # after the first epoch runs that dynamic graph.
    graphs: list[tuple[bool, tuple[int, ...], bool]] = []  # (gradients on, input shape, dynamic)
    calls: list[tuple[int, int]] = []  # (graph, batch) of every call of a compiled graph

    def counting(gm: torch.fx.GraphModule, inputs: list) -> object:
        index = len(graphs)
        shapes = [tuple(i.shape) for i in inputs if isinstance(i, torch.Tensor)]
        dynamic = any(isinstance(i, torch.SymInt) for i in inputs) or any(
            isinstance(d, torch.SymInt) for s in shapes for d in s
        )
        graphs.append((torch.is_grad_enabled(), shapes[0], dynamic))

        def run(*args: object) -> object:
            batch = next(a for a in args if isinstance(a, torch.Tensor) and a.dim() > 1)
            calls.append((index, len(batch)))
            return gm.forward(*args)

        return run

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=counting))
    params = hp(width=8, depth=1, compile=True, batch_size=32, eval_batch_size=7)
    counts = []
    for epochs in (1, 3):
        graphs.clear()
        calls.clear()
        spec = TrialSpec(model="mlp", data="synthetic", data_args=DATA, max_epochs=epochs)
        train(tmp_path / f"e{epochs}", spec, params)
        counts.append(list(graphs))
    one, three = counts
    # A static graph for each shape: training's two, evaluation's two.
    assert one == [
        (True, (32, 8), False),
        (True, (16, 8), False),
        (False, (7, 8), False),
        (False, (6, 8), False),
    ]
    # A 3-epoch trial compiles nothing its first epoch did not, and its full batches, in every
    # epoch, run the graph made for them.
    assert three == one, (one, three)
    assert {graph for graph, batch in calls if batch == 32} == {0}, calls
