"""A DDP trial's ranks on their nodes (tuner/trial/launch/ranks.py): which GPU and local rank
each gets, the network interface gloo and NCCL use between nodes, and a trial whose ranks do
not form their process group (issue 49, E5 and E11)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tuner.trial.frame.session import cuda_index
from tuner.trial.launch import ranks


def test_a_ranks_local_rank_is_the_cuda_index_of_its_gpu() -> None:
    # Issue 49, E11: code that runs torch.cuda.set_device(LOCAL_RANK) (a user's own loop, a
    # library) must land on the rank's own GPU. Ray gave node a's rank 0 GPU 1 and rank 1 GPU 0.
    where = [
        ("a", "10.0.0.1", ["1"], "eth0", 11),
        ("a", "10.0.0.1", ["0"], "eth0", 12),
        ("b", "10.0.0.2", ["0"], "ens5", 13),
    ]
    placed = ranks.placement(where, use_gpus=True)
    assert [p["visible"] for p in placed] == ["0,1", "0,1", "0"]
    assert [p["local_rank"] for p in placed] == [1, 0, 0]
    assert [p["local_world"] for p in placed] == [2, 2, 1]
    for w, p in zip(where, placed, strict=True):
        assert cuda_index(w[2], p["visible"]) == p["local_rank"]
    assert [p["ifname"] for p in placed] == ["eth0", "eth0", "ens5"]
    # CPU ranks on one node: numbered in rank order, no interface (loopback).
    one_node = [("a", "10.0.0.1", [], "eth0", 11), ("a", "10.0.0.1", [], "eth0", 12)]
    cpu = ranks.placement(one_node, use_gpus=False)
    assert [(p["local_rank"], p["visible"], p["ifname"]) for p in cpu] == [(0, None, None), (1, None, None)]


def test_ranks_on_several_nodes_need_an_interface_and_say_so_before_waiting() -> None:
    # Issue 49, E5: an address no interface of the node holds (NAT, a container's port
    # mapping) found no interface, and gloo and NCCL then took whatever the host name resolves
    # to (127.0.1.1 in Debian's /etc/hosts) and waited for peers that could not reach them.
    assert ranks._interface_of("203.0.113.7") is None  # TEST-NET-3: on no interface here
    with pytest.raises(RuntimeError, match=r"203\.0\.113\.7 is on none of this node's network interfaces"):
        ranks.socket_env(None, "10.0.0.1", {}, "203.0.113.7")
    set_by_user = {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    assert ranks.socket_env(None, "10.0.0.1", set_by_user, "203.0.113.7") == set_by_user
    found = ranks.socket_env("eth0", "10.0.0.1", {"NCCL_SOCKET_IFNAME": "ib0"}, "10.0.0.2")
    assert found == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "ib0"}  # the user's kept
    assert ranks.socket_env(None, ranks.LOOPBACK, {}, "203.0.113.7") == {}  # one node: loopback


@pytest.mark.usefixtures("ray_session")
def test_ranks_that_do_not_form_their_group_fail_the_trial_at_the_deadline(tmp_path: Path) -> None:
    # Issue 49, E5: NCCL's initialisation blocks, before any watchdog, for as long as a peer
    # does not answer (a filtered port); the trial actor waited on its ranks without a limit.
    # Here rank 1 never starts, so rank 0 waits in its process group's initialisation.
    import ray

    from tuner.trial.frame.spec import TrialSpec

    spec = TrialSpec(model="mlp", data="synthetic", workers=2, cpus_per_worker=0.5)
    rank = ray.remote(ranks.Rank).options(num_cpus=0.5, max_concurrency=3)
    group = [rank.remote(), rank.remote()]
    try:
        port = ray.get(group[0].open_store.remote(ranks.LOOPBACK, 2, 600.0))
        run_id = uuid.uuid4().hex
        job = dict(
            trial_dir=str(tmp_path), trial_id="t", run_id=run_id, rank=0, local_rank=0, local_world=2,
            host=ranks.LOOPBACK, port=port, timeout_s=600.0, visible=None, ifname=None, checkpoint=None,
        )  # fmt: skip
        runs = {group[0].run.remote({}, spec, job): 0}
        with pytest.raises(ranks.GroupNotFormed, match=r"ranks 0, 1 did not join .* within 2 s"):
            ranks.await_joined(group, runs, run_id, 2.0, "gloo")
    finally:
        for r in group:
            ray.kill(r)
