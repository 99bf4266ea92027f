"""`python who_runs_workers.py GCS_ADDRESS`: a task on each live node of the cluster prints how
that node started its worker (copied from a warm process or not, the worker's parent's command
line, its working directory), as a JSON list on the last line."""

import json
import os
import sys

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On

ray.init(address=sys.argv[1])


@ray.remote(num_cpus=0)
def who() -> dict:
    parent = open(f"/proc/{os.getppid()}/cmdline").read().split(chr(0))
    return {"copied": os.environ.get("TUNER_WORKER_COPIED"), "parent": parent, "cwd": os.getcwd()}


nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
print(json.dumps([ray.get(who.options(scheduling_strategy=On(n, soft=False)).remote()) for n in nodes]))
