"""A script's command line and the environment that changes what it computes: as the trial
runs it (`trial.script.run`) and as trial.log and the report print it, to train a
configuration again alone (`view.analysis`). Standard library only.

Threads: each process of the script (each rank under torchrun) gets its worker's CPUs as its
threads, in OMP_NUM_THREADS and MKL_NUM_THREADS, which torch and numpy's BLAS read when they
start, as tuner's own loop sets its threads to its worker's CPUs. Ray sets OMP_NUM_THREADS to
the CPUs of the trial's actor, and under torchrun that actor holds every worker's CPUs: each
rank ran with the trial's total (4 threads on 2 CPUs with 2 ranks). The order of a float sum,
and so its last bits, follows the thread count: a rerun at the machine's default gave another
value (issue 44). So the rerun line carries the threads, the devices and the parameters that
reach the script only through the environment (`task.env_params`), as an `env A=1 ...` prefix.
"""

from __future__ import annotations

import math
import os
import re
import shlex

THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEVICES = "CUDA_VISIBLE_DEVICES"
# Set by the user, they change results too: kept in the rerun line when the trial had them.
PASSED_ON = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG")


def threads(cpus_per_worker: float) -> int:
    """The threads of each of the script's processes: its worker's CPUs (at least 1)."""
    return max(1, int(cpus_per_worker))


def result_env(cpus_per_worker: float, devices: str) -> dict[str, str]:
    """The variables tuner sets that change what the script computes."""
    n = str(threads(cpus_per_worker))
    return {**dict.fromkeys(THREADS, n), DEVICES: devices}


def devices_for(workers: int, gpus_per_worker: float) -> str:
    """CUDA_VISIBLE_DEVICES for a rerun on a machine of its own: as many GPUs as the trial had
    (its workers' share, rounded up), numbered from 0; "" for none."""
    return ",".join(str(i) for i in range(math.ceil(workers * gpus_per_worker)))


def under_launcher(argv: list[str], launcher: str | None, workers: int, torchrun: list[str]) -> list[str]:
    """`argv` as the launcher runs it: under torchrun (`torchrun`: how to start it), with one
    process per worker and a leading `python` dropped (torchrun starts Python itself)."""
    if launcher != "torchrun":
        return list(argv)
    if re.fullmatch(r"python[\d.]*", os.path.basename(argv[0])):
        argv = argv[1:]
    return [*torchrun, "--standalone", f"--nproc-per-node={workers}", *argv]


def rerun_line(env: dict[str, str], argv: list[str]) -> str:
    """One shell line: `env A=1 B=2 argv...` (just the command when `env` is empty)."""
    return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv)
