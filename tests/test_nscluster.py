"""The namespaced cluster (tests/nscluster.py) is what it claims: separate machines that share
no files, token authentication on, Ray on the nodes' own addresses; it leaves nothing behind.
And a first sweep on it, as tuner is today: trials on both nodes, a local output."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests import nscluster
from tests.conftest import ROOT
from tuner.cluster import join

pytestmark = pytest.mark.slow


def _named(tag: str) -> set[str]:
    """Namespaces and links whose names carry `tag` (tests/nscluster.py names them so)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return set(re.findall(rf"\b(?:{nscluster.PREFIX}-{tag}-\w+|tn[bv]{tag}(?:x\d+)?)\b", names + links))


def test_nodes_are_separate_machines(ns_cluster: nscluster.NsCluster) -> None:
    c = ns_cluster
    head, w1 = c.head, c.nodes[1]
    assert [c.run(n, ["hostname"]).stdout.strip() for n in c.nodes] == ["head", "w1"]
    # A file on one node: not on the other, not on the host; the host's files not on a node.
    c.put(head, "/tmp/work/only-here.txt", "head's")
    assert c.run(head, ["cat", "/tmp/work/only-here.txt"]).stdout == "head's"
    assert c.run(w1, ["test", "-e", "/tmp/work/only-here.txt"]).returncode == 1
    assert not Path("/tmp/work/only-here.txt").exists()
    assert c.run(head, ["test", "-e", str(c.token_file)]).returncode == 1  # (on the host's /tmp)
    # The shared software (this repository) is read-only on the nodes: no node writes there.
    touched = c.run(w1, ["touch", str(ROOT / "written-by-a-node")])
    assert touched.returncode != 0 and "Read-only file system" in touched.stderr
    # Each node sees its own processes only, and its own network: lo and eth0.
    for node in c.nodes:
        pids = c.run(node, ["sh", "-c", "ls -d /proc/[0-9]* | wc -l"]).stdout
        assert 3 <= int(pids) < 80, pids  # PID 1, Ray's processes, this shell
        links = c.run(node, ["ip", "-o", "link", "show"]).stdout
        assert sorted(re.findall(r"^\d+: (\w+)", links, re.M)) == ["eth0", "lo"], links


def test_token_is_private_on_every_node_and_in_no_command_line(ns_cluster: nscluster.NsCluster) -> None:
    c = ns_cluster
    for node in c.nodes:
        assert c.run(node, ["stat", "-c", "%a", nscluster.TOKEN_PATH]).stdout.strip() == "600"
        cmdlines = c.run(node, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).stdout
        assert "ray" in cmdlines and c.token not in cmdlines
    everywhere = ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]
    assert c.token not in subprocess.run(everywhere, capture_output=True, text=True).stdout


def test_ray_listens_on_each_node_own_address_and_asks_for_the_token(ns_cluster: nscluster.NsCluster) -> None:
    c = ns_cluster
    lister = (
        "import psutil\n"
        "for x in psutil.net_connections('inet'):\n"
        "    if x.status == 'LISTEN': print(x.laddr.ip, x.laddr.port)\n"
    )
    for node in c.nodes:
        rows = [line.split() for line in c.run(node, ["python", "-c", lister]).stdout.splitlines()]
        assert len(rows) >= 4, rows
        own = {node.ip, f"::ffff:{node.ip}"}
        # Ray binds its C++ gRPC servers (GCS, raylet, object manager) and the agents' metrics
        # endpoints to every interface, whatever the node address: in a node's namespace that
        # is its own address and loopback, nothing else (the test above).
        wildcard = {"0.0.0.0", "::"}
        strays = [r for r in rows if r[0] not in own | wildcard and not join.is_loopback(r[0])]
        assert not strays, (node.name, strays)
        if node is c.head:  # the dashboard (jobs) and Ray Client on the node's own address
            assert {(a, int(p)) for a, p in rows} >= {
                (node.ip, nscluster.DASHBOARD_PORT),
                (f"::ffff:{node.ip}", nscluster.CLIENT_PORT),
            }, rows
    target = join.target(c.gcs)
    assert target is not None
    assert join.probe(target, token=None) is None  # from the host, over the bridge: refused
    assert join.probe(target, token="0" * 64) is None
    assert sorted(join.probe(target, token=c.token) or []) == sorted(n.ip for n in c.nodes)


def test_each_machine_node_started_by_tuner_cluster_node_copies_its_workers(
    ns_cluster: nscluster.NsCluster,
) -> None:
    # Each node here is `python -m tuner cluster node`, as deploy/slurm/tuner.sbatch starts a
    # machine's node: a task on each node runs in a worker copied from that node's own warm
    # process, whose socket is in a private directory of the node's own /tmp.
    c = ns_cluster
    out = c.run(c.head, ["python", str(ROOT / "tests" / "who_runs_workers.py"), c.gcs], timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(seen) == 2, seen
    for worker in seen:
        assert worker["copied"] == "1" and "tuner.cluster.worker_fork" in worker["parent"], seen
    for node in c.nodes:
        private = c.run(node, ["sh", "-c", "stat -c '%a %U' /tmp/tuner-node-*"]).stdout
        assert private == "700 root\n", (node.name, private)
        files = c.run(node, ["sh", "-c", "cd /tmp/tuner-node-* && ls && cat *.log"]).stdout.split()
        assert [f for f in files if f.endswith(".sock")] == ["fork-2.sock"], files  # (PID 2 of the node)
        assert files == ["fork-2.log", "fork-2.sock"], files  # (its log, empty: nothing went wrong)


def test_a_cluster_that_fails_to_start_leaves_nothing_behind(tmp_path: Path) -> None:
    nscluster.check_available()  # (the fixture's skip reason, if any, applies here too)
    made: set[str] = set()

    def broken(cluster: nscluster.NsCluster) -> dict[str, str]:
        made.update(_named(cluster.tag))
        raise RuntimeError("a service of the test failed")

    with pytest.raises(RuntimeError, match="a service of the test failed"):
        cluster = nscluster.NsCluster(workers=2, base=tmp_path / "c")
        cluster.start(setup=broken)
    assert len(made) == 1 + 3 + 3, made  # bridge, 3 namespaces, 3 veths: all made...
    assert _named(cluster.tag) == set() and not (tmp_path / "c").exists()  # ... and all removed


def test_leftovers_of_a_killed_run_are_removed(tmp_path: Path) -> None:
    nscluster.check_available()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs: the "owner" of what follows
    name = f"{nscluster.PREFIX}-{dead.pid}c0-head"
    subprocess.run(["ip", "netns", "add", name], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "300"], start_new_session=True)
    try:
        inside = ["ip", "netns", "pids", name]
        while not subprocess.run(inside, capture_output=True, text=True).stdout.split():
            assert sleeper.poll() is None, "the sleeper never entered its namespace"
            time.sleep(0.05)  # (until it runs inside: what remove_leftovers must find and kill)
        assert name in nscluster.remove_leftovers()
        assert sleeper.wait(timeout=10) != 0  # killed, not left running
        assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_joined_sweep_runs_trials_on_both_nodes_and_warns_about_its_local_output(
    ns_cluster: nscluster.NsCluster,
) -> None:
    # Today's tuner on machines that share no disk (issue 29): the driver joins from the head
    # (`tuner sweep --address`), two trials at once, one CPU per node, a local output; trials
    # of 8 s (nscluster.sleeping_sweep: long enough for the worker node's actor to start).
    c = ns_cluster
    c.put(c.head, "/tmp/work/joined.yaml", nscluster.sleeping_sweep("joined"))
    out = c.run(
        c.head,
        ["python", "-m", "tuner", "sweep", "joined.yaml", "--address", c.gcs, "--output", "/tmp/work/runs"],
        timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 of 2 nodes are on other machines and output /tmp/work/runs is a local path" in out.stderr
    sweep = c.head.path("/tmp/work/runs/joined")
    ran_on = {
        t.parent.name: {json.loads(line)["node_ip"] for line in t.read_text().splitlines()}
        for t in sweep.glob("*/result.json")
    }
    assert len(ran_on) == 4 and set().union(*ran_on.values()) == {n.ip for n in c.nodes}, (ran_on, out.stderr)
    # What each trial wrote itself stays on the node that ran it: the gap object storage closes.
    away = [t for t, ips in ran_on.items() if ips == {c.nodes[1].ip}]
    for trial in away:
        assert not (sweep / trial / "metrics.jsonl").exists()
        assert c.nodes[1].path(f"/tmp/work/runs/joined/{trial}/metrics.jsonl").is_file()
    assert c.token not in out.stdout + out.stderr
