"""GPU benchmark of the trial loop: one command on a GPU machine, a table, BENCHMARKS.md.

    python scripts/bench_gpu.py                 # all sections; appends the table to BENCHMARKS.md
    python scripts/bench_gpu.py --sections amp,mfu --no-write
    python scripts/bench_gpu.py --smoke         # tiny sizes on CPU in seconds; writes nothing

Every row is a real trial (`run_trial`, the loop sweeps run) in its own temporary directory;
samples/s is the median over epochs after the first (which pays for start-up and compiling),
peak memory the largest `torch.cuda.max_memory_allocated` of an epoch.

- amp: the ViT reference (ViT-S/16 on 224x224, batch 128, 112 steps an epoch) in IEEE fp32,
  fp32 on TF32 tensor cores (what `amp: off` runs by default), bf16 and fp16; 5 epochs each,
  4 of them timed (short epochs measure the start of each epoch as much as its steps).
- pipeline: bf16 with torch.compile; bf16 fed by a DataLoader (synthetic_images made on the
  fly by worker processes, pinned memory) with the prefetcher off and on.
- packing, two kinds of trial, both reported:
  launch-bound: 1, 2 and 4 small trials (ViT 192x6 on 32x32) at once on one GPU. One alone
  leaves the GPU idle between its kernel launches (Python and the launch queue are the limit),
  so packing several fills those gaps: what this row measures is CPU-side concurrency, and its
  target is met by construction on any fast GPU.
  GPU-bound: 1 and 2 ViT-S/16 trials on 224x224 at once: one alone keeps the GPU busy, so two
  can at best share it (near 1x); what it shows is what packing costs a large trial.
  Each trial is capped at its share as a packed sweep's trials are. Every trial's process is
  started and has its CUDA context before a barrier releases them together; each trains for
  `--packed-seconds`; the figure is the samples all of them trained inside the window they all
  ran (after each one's first, warm-up epoch), per second.
- mfu: a ViT-B/16 trial in bf16 (over 100 steps an epoch); model FLOPs per sample counted by
  FlopCounterMode on the meta device (forward + backward), divided by the device's peak dense
  bf16 FLOPS.

samples/s are measured after a device synchronisation (the loop syncs once an epoch on CUDA),
so they count the GPU's work, not its launch.

Targets on H100/H200 (checked and printed): AMP >= 2x fp32 on TF32 (the fair baseline; the
ratio to IEEE fp32 is printed too), 4 packed launch-bound trials >= 1.5x one, bf16 MFU >= 35%,
no trial failed. The GPU-bound packing ratio is printed unjudged (no target: see above).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from tuner import packing  # noqa: E402
from tuner.config import TrainingSection  # noqa: E402
from tuner.trial.frame.session import LocalSession  # noqa: E402
from tuner.trial.frame.spec import TrialSpec  # noqa: E402
from tuner.trial.loop.data import DataBundle, TensorData  # noqa: E402
from tuner.trial.loop.run import run_trial  # noqa: E402

# Peak dense bf16 tensor-core TFLOPS (datasheets give "with sparsity" figures: half of those).
# H100 SXM / H200 SXM: 989.4 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022; H200
# datasheet, 1,979 with sparsity); H100 NVL and H200 NVL 835.5, H100 PCIe 756.5 (H100 and H200
# datasheets, nvidia.com/en-us/data-center); A100: 312 (A100 datasheet); L40S: 362 and L40:
# 181 (L40S and L40 datasheets); L4: 121 (L4 datasheet); A10: 125 (A10 datasheet); GH200: its
# Hopper GPU as the H100 SXM's (the GH200 Grace Hopper Superchip datasheet rounds it to 990).
# A key matches whole words of the device name ("L4" is not "L40"); the longest match wins.
PEAK_BF16_TFLOPS = {
    "GH200": 989.4,
    "H200": 989.4,
    "H200 NVL": 835.5,
    "H100": 989.4,
    "H100 NVL": 835.5,
    "H100 PCIe": 756.5,
    "A100": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "A10": 125.0,
}
TARGETS = {"amp": 2.0, "packing": 1.5, "mfu": 0.35}
# Epochs per trial: the first (start-up, compiling) is not timed; on a GPU 4 are.
GPU_EPOCHS, SMOKE_EPOCHS = 5, 2


VIT_KEYS = ("label", "patch_size", "width", "depth", "heads", "image", "samples", "batch")


def _vit(*values: Any) -> dict[str, Any]:
    return dict(zip(VIT_KEYS, values, strict=True))


# Sizes: (GPU, smoke). ViT reference = ViT-S/16; MFU = ViT-B/16; small = a CIFAR-sized ViT
# (launch-bound on a GPU); big = ViT-S/16 again, GPU-bound, packed. Smoke sizes are the
# smallest that run every path (compile, the DataLoader, packed processes) in seconds.
# 16384 samples: 1/8 held out, 14336 to train, 112 steps of 128 an epoch.
SIZES = {
    "ref": (
        _vit("ViT-S/16 224px", 16, 384, 12, 6, 224, 16384, 128),
        _vit("tiny ViT 32px", 8, 32, 2, 2, 32, 256, 32),
    ),
    "mfu": (
        # 16384 samples: 112 steps of 128 an epoch, each timed epoch over 100 steps.
        _vit("ViT-B/16 224px", 16, 768, 12, 12, 224, 16384, 128),
        # Smoke: the reference's size, so that its compiled run finds the pipeline row's
        # compiled graph in Inductor's cache (a graph compiled cold costs ~45 s on 2 cores).
        _vit("tiny ViT 32px", 8, 32, 2, 2, 32, 256, 32),
    ),
    "small": (
        _vit("ViT 192x6 32px", 4, 192, 6, 3, 32, 8192, 128),
        _vit("tiny ViT 32px", 8, 32, 1, 2, 32, 256, 32),
    ),
    "big": (
        # 28 steps an epoch: packed trials are timed over a window of many epochs.
        _vit("ViT-S/16 224px", 16, 384, 12, 6, 224, 4096, 128),
        _vit("tiny ViT 32px", 8, 32, 1, 2, 32, 256, 32),
    ),
}


def images(config: dict[str, Any]) -> DataBundle:
    """Random uint8 images held in memory (gathered on the device): the model is measured."""
    g = torch.Generator().manual_seed(0)
    size, n, k = int(config["image"]), int(config["samples"]), 10
    x = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    y = torch.randint(0, k, (n,), generator=g)
    n_val = max(1, n // 8)
    return DataBundle(
        TensorData(x[n_val:], y[n_val:]), TensorData(x[:n_val], y[:n_val]), (3, size, size), k, 1 / 255
    )


class TimedSession(LocalSession):
    """A LocalSession that notes when each epoch ended and stops the trial after `seconds`
    (and at least `MIN_TIMED_EPOCHS` epochs: a warm-up epoch and some to measure).

    Packed trials (`warm`: how many of them have ended their warm-up epoch, and when the last
    did) count their `seconds` from the moment all of them are past it, so that they all train
    together for that long however unevenly their warm-ups went (a busy machine; the smoke's
    2 packed trials once shared no window at all)."""

    def __init__(self, root: str, seconds: Optional[float], warm: Optional[tuple[Any, Any, int]] = None):
        super().__init__(root)
        self.seconds, self.t0, self.warm = seconds, time.monotonic(), warm
        self.ends: list[float] = []  # time.monotonic(): one clock for every process here

    def report(self, metrics: dict[str, Any], state: Optional[dict[str, Any]]) -> None:
        super().report(metrics, None)  # no checkpoints: the loop is measured, not storage
        self.ends.append(time.monotonic())
        if self.warm is not None and len(self.ends) == 1:
            count, since, n = self.warm
            with count.get_lock():
                count.value += 1
                if count.value == n:
                    since.value = self.ends[-1]
        if self.seconds is None or len(self.ends) < MIN_TIMED_EPOCHS:
            return
        if self.warm is not None:
            count, since, n = self.warm
            if count.value == n:
                self.t0 = since.value
            elif self.ends[-1] - self.t0 < 10 * self.seconds:
                return  # (past that, a packed trial that failed in its warm-up ends no one's)
        if self.ends[-1] - self.t0 >= self.seconds:
            raise _Enough


MIN_TIMED_EPOCHS = 3


class _Enough(BaseException):
    """Stops a timed trial, as a scheduler's stop does (not an error of the trial)."""


def trial(
    size: dict[str, Any],
    *,
    gpu: float,
    epochs: int,
    in_memory: bool = True,
    seconds: Optional[float] = None,
    warm: Optional[tuple[Any, Any, int]] = None,
    **hp: Any,
) -> dict[str, Any]:
    """One trial; its steady samples/s, peak memory, failure (None if it finished) and, per
    epoch, (end time, samples, seconds) for the packing window (`warm`: TimedSession's)."""
    data_args = {"image": size["image"], "samples": size["samples"]}
    spec = TrialSpec(
        model="vit",
        data="bench_gpu:images" if in_memory else "synthetic_images",
        data_args=data_args if in_memory else {"size": size["image"], "samples": size["samples"]},
        max_epochs=epochs if seconds is None else 1_000_000,
        gpus_per_worker=gpu,
        search_path=str(HERE),
    )
    params = {
        **TrainingSection().model_dump(),
        **{k: size[k] for k in ("patch_size", "width", "depth", "heads")},
        "batch_size": size["batch"],
        "eval_batch_size": 256,
        "optimizer": "adamw",
        **hp,
    }
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        session = TimedSession(tmp, seconds, warm)
        try:
            run_trial(params, spec, session)
        except _Enough:
            pass
    m = session.metrics
    rates = [r["samples_per_s"] for r in m]
    return {
        "samples_per_s": statistics.median(rates[1:] or rates) if rates else 0.0,
        "peak_gib": max((r.get("gpu_mem_peak_gb", 0.0) for r in m), default=0.0),
        "failure": m[-1].get("failure") if m else "no result",
        "epochs": [(t, r["train_samples"], r["epoch_time_s"]) for t, r in zip(session.ends, m, strict=True)],
    }


def shared_rate(runs: list[list[tuple[float, int, float]]]) -> tuple[float, float]:
    """Samples per second of all runs together inside the window every one of them was
    training (from the end of its first epoch to the end of its last), and the window.

    An epoch's samples are spread evenly over its time; a run that never got past its first
    epoch leaves no window (0, 0).
    """
    if any(len(r) < 2 for r in runs):
        return 0.0, 0.0
    start = max(r[0][0] for r in runs)
    end = min(r[-1][0] for r in runs)
    if end <= start:
        return 0.0, 0.0
    total = 0.0
    for run in runs:
        for t_end, samples, seconds in run:
            overlap = min(t_end, end) - max(t_end - seconds, start)
            if overlap > 0:
                total += samples * overlap / seconds
    return total / (end - start), end - start


def flops_per_sample(size: dict[str, Any]) -> float:
    """Training FLOPs (forward + backward) of one sample, counted on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    from tuner.trial.loop.models import ViT

    hp = {k: size[k] for k in ("patch_size", "width", "depth", "heads")}
    with torch.device("meta"):
        model = ViT(hp, (3, size["image"], size["image"]), 10)
        x = torch.empty(2, 3, size["image"], size["image"])
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops() / 2


def peak_tflops(device_name: str) -> Optional[float]:
    words = " " + " ".join(re.split(r"[\s-]+", device_name)) + " "
    keys = sorted((k for k in PEAK_BF16_TFLOPS if f" {k} " in words), key=len, reverse=True)
    return PEAK_BF16_TFLOPS[keys[0]] if keys else None


class Bench:
    def __init__(self, smoke: bool, epochs: int, packed_seconds: float):
        self.smoke, self.epochs, self.packed_seconds = smoke, epochs, packed_seconds
        self.gpu = 0.0 if smoke else 1.0
        self.rows: list[tuple[str, str, dict[str, Any]]] = []
        self.checks: list[tuple[str, float, Optional[float]]] = []

    def size(self, name: str) -> dict[str, Any]:
        return SIZES[name][1 if self.smoke else 0]

    def add(self, section: str, run: str, result: dict[str, Any]) -> dict[str, Any]:
        self.rows.append((section, run, result))
        print(f"  {section:9s} {run:44s} {result['samples_per_s']:10.1f} samples/s", flush=True)
        return result

    def amp(self) -> None:
        ref = self.size("ref")
        name = ref["label"]
        run = dict(gpu=self.gpu, epochs=self.epochs)
        ieee = self.add("amp", f"{name} fp32 (IEEE)", trial(ref, **run, amp="off", tf32=False))
        tf32 = self.add("amp", f"{name} fp32 (TF32)", trial(ref, **run, amp="off", tf32=True))
        best = self.add("amp", f"{name} bf16", trial(ref, **run, amp="bf16"))
        if not self.smoke:  # fp16 needs CUDA
            fp16 = self.add("amp", f"{name} fp16", trial(ref, gpu=1.0, epochs=self.epochs, amp="fp16"))
            best = max(best, fp16, key=lambda r: r["samples_per_s"])
        self.checks.append(("AMP / fp32 (TF32) samples/s", _ratio(best, tf32), TARGETS["amp"]))
        self.checks.append(("AMP / fp32 (IEEE) samples/s", _ratio(best, ieee), None))
        self.checks.append(("fp32 TF32 / IEEE samples/s", _ratio(tf32, ieee), None))

    def pipeline(self) -> None:
        ref, workers = self.size("ref"), 0 if self.smoke else 8
        run = dict(gpu=self.gpu, epochs=self.epochs, amp="bf16")
        self.add("pipeline", f"{ref['label']} bf16 + torch.compile", trial(ref, **run, compile=True))
        loader = dict(in_memory=False, loader_workers=workers)
        # ABBA order, each row the mean of its two runs: run back to back once each, the
        # second row read some 16% lower on an H100 whichever it was (BENCHMARKS.md).
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for prefetch in (False, True, True, False):
            runs[prefetch].append(trial(ref, **run, **loader, prefetch=prefetch))
        for prefetch, pair in runs.items():
            mean = dict(pair[0], samples_per_s=statistics.fmean(r["samples_per_s"] for r in pair))
            mean["failure"] = next((r["failure"] for r in pair if r["failure"]), None)
            mean["note"] = "mean of 2, ABBA: " + ", ".join(f"{r['samples_per_s']:.1f}" for r in pair)
            name = f"bf16, DataLoader({workers}), " + ("prefetch" if prefetch else "no prefetch")
            self.add("pipeline", name, mean)

    def packing(self, counts: list[int]) -> None:
        """Launch-bound small trials, `counts` at once, judged; then 1 and 2 GPU-bound ones,
        reported beside them (see the module's docstring)."""
        self.packed("launch-bound", self.size("small"), counts, TARGETS["packing"])
        self.packed("GPU-bound", self.size("big"), [1, 2], None)

    def packed(self, kind: str, size: dict[str, Any], counts: list[int], target: Optional[float]) -> None:
        amp = "off" if self.smoke else "bf16"
        aggregate = {}
        for n in counts:
            gpu = 0.0 if self.smoke else packing.fraction_for(n)
            results = run_together(n, size, dict(gpu=gpu, epochs=0, amp=amp, seconds=self.packed_seconds))
            rate, window = shared_rate([r["epochs"] for r in results])
            total = {
                "samples_per_s": rate,
                "peak_gib": max(r["peak_gib"] for r in results),
                "failure": next((r["failure"] for r in results if r["failure"]), None),
                "note": f"window {window:.1f} s all {n} ran",
            }
            if window <= 0:
                total["failure"] = total["failure"] or "no shared window: a run ended in its first epoch"
            where = "on the CPU" if self.smoke else "on one GPU"
            aggregate[n] = self.add("packing", f"{n} x {size['label']} {where}, together ({kind})", total)
        if len(counts) > 1:
            ratio = _ratio(aggregate[counts[-1]], aggregate[counts[0]])
            self.checks.append((f"{counts[-1]} packed / {counts[0]} samples/s ({kind})", ratio, target))

    def mfu(self, device_name: str) -> None:
        """Eager and compiled (`training.compile: true`); the target is judged on the better."""
        size = self.size("mfu")
        peak, per_sample = peak_tflops(device_name), flops_per_sample(size)
        best = 0.0
        for compiled in (False, True):
            label = f"{size['label']} bf16" + (" + torch.compile" if compiled else "")
            run = dict(gpu=self.gpu, epochs=self.epochs, amp="bf16", compile=compiled)
            result = self.add("mfu", label, trial(size, **run))
            achieved = per_sample * result["samples_per_s"]
            result["note"] = f"{achieved / 1e12:.3g} TFLOPS"
            if peak is not None:
                result["note"] += f" = {achieved / (peak * 1e12):.1%} MFU of {peak:g}"
                best = max(best, achieved / (peak * 1e12))
        if peak is not None:
            self.checks.append(("bf16 MFU (the better of eager and compiled)", best, TARGETS["mfu"]))

    def table(self) -> str:
        lines = ["| section | run | samples/s | peak GiB | note |", "| --- | --- | ---: | ---: | --- |"]
        for section, run, r in self.rows:
            note = r.get("note", "") + (f" FAILED: {r['failure']}" if r["failure"] else "")
            peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] else "n/a"
            lines.append(f"| {section} | {run} | {r['samples_per_s']:.1f} | {peak} | {note.strip()} |")
        return "\n".join(lines)

    def verdict(self) -> list[str]:
        """The ratios, each against its target on a GPU (smoke runs print them unjudged)."""
        failed = [run for _, run, r in self.rows if r["failure"]]
        out = []
        for name, value, target in self.checks:
            judged = target is not None and not self.smoke
            verdict = f" (target >= {target:g}) {'PASS' if value >= target else 'FAIL'}" if judged else ""
            out.append(f"- {name}: {value:.2f}{verdict}")
        out.append(f"- no trial failed (no OOM): {'PASS' if not failed else 'FAIL: ' + ', '.join(failed)}")
        if self.smoke:
            out.append("Targets apply to H100/H200 GPUs; not checked in smoke mode.")
        return out


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    return a["samples_per_s"] / b["samples_per_s"] if b["samples_per_s"] else 0.0


def run_together(n: int, size: dict[str, Any], kw: dict[str, Any]) -> list[dict[str, Any]]:
    """`n` timed trials in their own processes, released together once all are ready."""
    ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
    barrier, results = ctx.Barrier(n), ctx.Queue()
    warm = (ctx.Value("i", 0), ctx.Value("d", 0.0), n)  # see TimedSession
    args = (size, {**kw, "warm": warm}, barrier, results)
    procs = [ctx.Process(target=_together, args=args) for _ in range(n)]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=kw["seconds"] + 600) for _ in procs]
    for proc in procs:
        proc.join()
    return out


def _together(size: dict[str, Any], kw: dict[str, Any], barrier: Any, results: Any) -> None:
    torch.set_num_threads(1)
    if kw["gpu"] > 0:
        torch.empty(1, device="cuda")  # the CUDA context, before the clock starts for anyone
    barrier.wait()
    results.put(trial(size, **kw))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU; targets not checked")
    parser.add_argument("--sections", default="amp,pipeline,packing,mfu", help="comma-separated subset")
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs per trial, the first not timed (5; smoke 2)"
    )
    parser.add_argument(
        "--packed", default=None, help="launch-bound trials per GPU to compare (default 1,2,4; smoke 1,2)"
    )
    parser.add_argument(
        "--packed-seconds",
        type=float,
        default=None,
        help="training time of each packed trial (30; smoke 1.5)",
    )
    parser.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="append to BENCHMARKS.md (default: yes on a GPU, no with --smoke)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("error: no CUDA GPU here; use --smoke for the CPU check", file=sys.stderr)
        return 2
    device = "CPU (smoke)" if args.smoke else torch.cuda.get_device_name(0)
    epochs = args.epochs or (SMOKE_EPOCHS if args.smoke else GPU_EPOCHS)
    bench = Bench(args.smoke, epochs, args.packed_seconds or (1.5 if args.smoke else 30.0))
    counts = [int(c) for c in (args.packed or ("1,2" if args.smoke else "1,2,4")).split(",")]
    print(f"[bench_gpu] {device}: {args.sections}", flush=True)
    for section in args.sections.split(","):
        {
            "amp": bench.amp,
            "pipeline": bench.pipeline,
            "packing": lambda: bench.packing(counts),
            "mfu": lambda: bench.mfu(device),
        }[section]()
    date = datetime.date.today().isoformat()
    cuda = torch.version.cuda or "cpu"
    report = "\n".join(
        [
            f"### {device}, {date}",
            "",
            f"`{' '.join(['python scripts/bench_gpu.py', *(sys.argv[1:] if argv is None else argv)])}`",
            f"(torch {torch.__version__}, CUDA {cuda}, {epochs} epochs per trial; packed trials "
            f"{bench.packed_seconds:g} s each)",
            "",
            bench.table(),
            "",
            *bench.verdict(),
            "",
        ]
    )
    print("\n" + report)
    if args.write if args.write is not None else not args.smoke:
        with open(args.out, "a") as f:
            f.write("\n" + report)
        print(f"[bench_gpu] appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
