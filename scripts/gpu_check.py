"""The first thing a lent GPU runs: what only a GPU can tell of issue 49's fixes, most truth
per minute first, each step in a process of its own under its own timeout, each one JSON line.

    python3 scripts/gpu_check.py [--out FILE] [--only loader,ddp_compile,...]   # on the GPU, ~5 min
    python3 scripts/gpu_check.py --cpu [--out FILE]   # each step's CPU half, tiny sizes (the tests)

The steps, in order:

- loader: autotune's loader arms (`training.autotune`'s `loader_workers`) read two ways: the
  old short window (20 steps straight after the warm-up, the prefetch buffer timed as speed)
  and the steady window autotune now measures (`tuner.trial.loop.autotune.measure`). On the GPU:
  ViT-S/16 in bf16 fed 224 px synthetic images by 3 and by 8 workers (BENCHMARKS.md: the
  3-worker arms read 2386-3209 samples/s where 8 workers sustain about 3700). On CPU: a loader
  that sleeps 30 ms a batch and a model whose first step sleeps 0.5 s (a compile), by 1 and 2
  workers: the steady rate must be the loader's, the short one above it.
- ddp_compile: a compiled DDP trial of the built-in CNN (an nn.Sequential) on one rank of a
  process group of one (NCCL on the GPU; two DDP ranks want two GPUs), the loop's whole path:
  Dynamo's frames, the graphs of training and of evaluation, none with dynamic sizes.
- compiled_trials: four compiled trials of four model sizes in one process, as a reused trial
  actor runs them: graphs and recompiles each, and the CUDA memory the process holds after
  each (the context, the allocator's cache), which must not grow from trial to trial.
- gpu_tests: `pytest -m gpu tests/test_gpu_cuda.py tests/test_gpu_any_training.py` (GPU only).

Each line: {"step", "ok", "seconds", ...its figures} or {"step", "ok": false, "error"}; a
step past its timeout is killed and says so, and the next one runs. The exit status is 0 when
every step that ran is ok. On the CPU the compiles use Dynamo's eager backend: what is captured
(frames, graphs, recompiles) is the backend's input, the same whichever compiles it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]

# step -> seconds it may take on the GPU (the CPU halves get the same: slow machines, small work)
STEPS = {"loader": 120, "ddp_compile": 90, "compiled_trials": 120, "gpu_tests": 300}
GPU_TESTS = ["tests/test_gpu_cuda.py", "tests/test_gpu_any_training.py"]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="each step's CPU half, tiny sizes")
    ap.add_argument("--out", help="append the JSON lines to this file too")
    ap.add_argument("--only", help="comma-separated steps (default: all)")
    ap.add_argument("--step", help=argparse.SUPPRESS)  # a step, in its own process
    args = ap.parse_args(argv)
    if args.step:
        return _run_step(args.step, args.cpu)
    steps = args.only.split(",") if args.only else list(STEPS)
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        ap.error(f"unknown steps {unknown}: choose from {', '.join(STEPS)}")
    ok = True
    for step in steps:
        if args.cpu and step == "gpu_tests":
            line: dict[str, Any] = {"step": step, "ok": True, "skipped": "the GPU tests need a GPU"}
        else:
            line = _in_process(step, args.cpu, STEPS[step])
        ok = ok and line.get("ok") is not False
        text = json.dumps(line, default=str)
        print(text, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(text + "\n")
    return 0 if ok else 1


def _in_process(step: str, cpu: bool, timeout_s: float) -> dict[str, Any]:
    """One step in a fresh Python (as a trial actor is), killed past `timeout_s`."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", step] + ["--cpu"] * cpu
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"step": step, "ok": False, "error": f"timed out after {timeout_s:g} s", "seconds": timeout_s}
    seconds = round(time.monotonic() - t0, 1)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"step": step, "ok": False, "error": " | ".join(tail), "seconds": seconds}
    return {**json.loads(lines[-1]), "seconds": seconds}


def _run_step(step: str, cpu: bool) -> int:
    import torch

    if not cpu and not torch.cuda.is_available():
        print(json.dumps({"step": step, "ok": False, "error": "no CUDA device (--cpu runs the CPU halves)"}))
        return 0
    result = {"step": step, **STEP_FUNCTIONS[step](cpu)}
    print(json.dumps(result, default=str), flush=True)
    return 0


# ----------------------------------------------------------------------------- shared


def _backend(cpu: bool) -> None:
    """On CPU, every torch.compile through Dynamo's eager backend (no C++ to build)."""
    if not cpu:
        return
    import torch

    real = torch.compile

    def eager(fn: Any = None, **kw: Any) -> Any:
        return real(fn, **{**kw, "backend": "eager"})

    torch.compile = eager  # type: ignore[assignment]


def _hp(**kw: Any) -> dict[str, Any]:
    from tuner.config import TrainingSection

    return {**TrainingSection().model_dump(), "lr": 3e-3, **kw}


SLEEPY = """
import time
import torch
from torch.utils.data import Dataset


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

    def __getitems__(self, idx):
        time.sleep(self.delay)
        return [(self.x[i], self.y[i]) for i in idx]


def data(config):
    return Slow(16 * 200, 0.03), Slow(64, 0.0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 2)
        self.first = True

    def forward(self, x):
        if self.first:
            time.sleep(0.5)
            self.first = False
        return self.fc(x)


def model(config, input_shape, num_classes):
    return Net()
"""


# ----------------------------------------------------------------------------- loader


def loader(cpu: bool) -> dict[str, Any]:
    if not cpu:
        return _loader(cpu, "")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:  # the CPU half's model module
        return _loader(cpu, tmp)


def _loader(cpu: bool, tmp: str) -> dict[str, Any]:
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.loop import autotune as arms

    if cpu:
        Path(tmp, "gpu_check_sleepy.py").write_text(textwrap.dedent(SLEEPY))
        spec = TrialSpec(
            model="gpu_check_sleepy:model", data="gpu_check_sleepy:data", cpus_per_worker=1, search_path=tmp
        )
        config, workers = _hp(batch_size=16, threads=1), (1, 2)
    else:
        spec = TrialSpec(
            model="vit", data="synthetic_images", data_args={"samples": 16384, "size": 224},
            cpus_per_worker=max(1, (os.cpu_count() or 2) - 1), gpus_per_worker=1,
        )  # fmt: skip
        config = _hp(batch_size=128, amp="bf16", patch_size=16, width=384, depth=12, heads=6)
        workers = (3, 8)
    device = arms.device_for(spec)
    rows = {}
    for w in workers:
        settings = {"loader_workers": w}
        short = _short_window(config, spec, settings, device)
        steady = arms.measure(config, spec, settings, device, seconds_left=100.0)
        rows[w] = {
            "short": round(short, 1),
            "steady": round(steady.samples_per_s, 1),
            "short_over_steady": round(short / steady.samples_per_s, 3) if steady.samples_per_s else None,
            "spread": round(steady.spread, 4),
            "steps": steady.steps,
            "error": steady.error,
        }
    ok = all(r["error"] is None for r in rows.values())
    if cpu:  # at most the loader's own rate: 16 samples a 30 ms batch, per worker
        ok = ok and all(r["steady"] <= w * 16 / 0.03 * 1.05 for w, r in rows.items())
    return {"ok": ok, "arms": rows, "device": str(device)}


def _short_window(config: dict[str, Any], spec: Any, settings: dict[str, Any], device: Any) -> float:
    """samples/s as autotune read them before issue 49: 3 warm-up steps, then 20 timed."""
    from itertools import islice

    from tuner.trial.frame.gpu import make_gpu
    from tuner.trial.frame.harness import use_threads
    from tuner.trial.frame.session import LocalSession
    from tuner.trial.loop.autotune import AS_SET, _steps
    from tuner.trial.loop.run import build_parts, optimizer_step

    use_threads(int(config.get("threads") or spec.cpus_per_worker))  # as autotune's arms run
    gpu = make_gpu(device)
    with tempfile.TemporaryDirectory() as tmp:
        p = build_parts({**config, **settings, **AS_SET}, spec, LocalSession(tmp), device, gpu)
        try:
            batches = _steps(p)
            for x, y in islice(batches, 3):
                optimizer_step(p, x, y)
            gpu.sync()
            start, seen = time.perf_counter(), 0
            for x, y in islice(batches, 20):
                optimizer_step(p, x, y)
                seen += len(y)
            gpu.sync()
            return seen / (time.perf_counter() - start)
        finally:
            p.close()


# ----------------------------------------------------------------------------- ddp_compile


def ddp_compile(cpu: bool) -> dict[str, Any]:
    import torch
    from torch._dynamo.utils import counters

    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.loop.autotune import ArmSession, one_rank_group
    from tuner.trial.loop.run import run_trial

    graphs: list[dict[str, Any]] = []
    inner = "eager" if cpu else "inductor"

    def noting(gm: Any, inputs: list) -> Any:
        dynamic = any(isinstance(i, torch.SymInt) for i in inputs)
        graphs.append({"training": torch.is_grad_enabled(), "dynamic": dynamic})
        return torch._dynamo.lookup_backend(inner)(gm, inputs)

    real = torch.compile
    torch.compile = lambda fn=None, **kw: real(fn, **{**kw, "backend": noting})  # type: ignore[assignment]
    size = 16 if cpu else 32
    spec = TrialSpec(
        # (230 samples: 184 to train, 92 a rank, in steps of 32 and a partial one of 28)
        model="cnn", data="synthetic_images", data_args={"samples": 230 if cpu else 8000, "size": size},
        workers=2, strategy="ddp", gpus_per_worker=0 if cpu else 1, max_epochs=2,
    )  # fmt: skip
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    with tempfile.TemporaryDirectory() as tmp, one_rank_group(spec, device):
        session = ArmSession(tmp, 2)
        run_trial(_hp(batch_size=64, channels=8 if cpu else 32, blocks=1, compile=True), spec, session)
    last = session.metrics[-1] if session.metrics else {}
    ok = (
        any(g["training"] for g in graphs)
        and any(not g["training"] for g in graphs)
        and not any(g["dynamic"] for g in graphs)
        and "error" not in last
    )
    return {
        "ok": ok,
        "frames": dict(counters["frames"]),
        "graphs": len(graphs),
        "training_graphs": sum(g["training"] for g in graphs),
        "evaluation_graphs": sum(not g["training"] for g in graphs),
        "dynamic_graphs": sum(g["dynamic"] for g in graphs),
        "samples_per_s": last.get("samples_per_s"),
        "val_loss": last.get("val_loss"),
    }


# ----------------------------------------------------------------------------- compiled_trials


def compiled_trials(cpu: bool) -> dict[str, Any]:
    import torch
    from torch._dynamo.utils import counters

    from tuner.trial.frame.session import LocalSession
    from tuner.trial.frame.spec import TrialSpec
    from tuner.trial.loop.run import run_trial

    _backend(cpu)
    size = 16 if cpu else 32
    spec = TrialSpec(
        model="vit", data="synthetic_images", data_args={"samples": 160 if cpu else 8000, "size": size},
        gpus_per_worker=0 if cpu else 1, max_epochs=1 if cpu else 2,
    )  # fmt: skip
    trials = []
    for width in (32, 48, 64, 96) if cpu else (192, 256, 320, 384):
        before = dict(counters["stats"])
        recompiles = sum(counters["recompiles"].values()) if "recompiles" in counters else 0
        with tempfile.TemporaryDirectory() as tmp:
            session = LocalSession(tmp)
            hp = _hp(batch_size=64, patch_size=4, width=width, depth=2 if cpu else 6, heads=4, compile=True)
            if not cpu:
                hp["amp"] = "bf16"
            run_trial(hp, spec, session)
        row: dict[str, Any] = {
            "width": width,
            "graphs": counters["stats"]["unique_graphs"] - before.get("unique_graphs", 0),
            "recompiles": (sum(counters["recompiles"].values()) if "recompiles" in counters else 0)
            - recompiles,
            "samples_per_s": session.metrics[-1].get("samples_per_s") if session.metrics else None,
        }
        if not cpu:
            free, total = torch.cuda.mem_get_info()
            row["used_gib"] = round((total - free) / 2**30, 3)
            row["reserved_gib"] = round(torch.cuda.memory_reserved() / 2**30, 3)
            row["allocated_gib"] = round(torch.cuda.memory_allocated() / 2**30, 3)
        trials.append(row)
    ok = all(t["graphs"] > 0 for t in trials)  # every trial compiled: none past Dynamo's limit, eager
    if not cpu:  # the process holds no more after the 4th trial than after the 1st (a little slack)
        ok = ok and trials[-1]["used_gib"] <= trials[0]["used_gib"] + 0.5
    return {"ok": ok, "trials": trials}


# ----------------------------------------------------------------------------- gpu_tests


def gpu_tests(cpu: bool) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-m", "gpu", *GPU_TESTS],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else done.stderr.strip()[-300:]
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return {"ok": done.returncode == 0, "summary": summary, "failed": failed}


STEP_FUNCTIONS: dict[str, Callable[[bool], dict[str, Any]]] = {
    "loader": loader,
    "ddp_compile": ddp_compile,
    "compiled_trials": compiled_trials,
    "gpu_tests": gpu_tests,
}
assert set(STEP_FUNCTIONS) == set(STEPS)


if __name__ == "__main__":
    raise SystemExit(main())
