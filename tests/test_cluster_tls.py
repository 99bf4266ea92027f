"""Encrypted cluster traffic on separate machines (tests/nscluster.py with `tls=True`): a sweep
joins the TLS cluster, what crosses the network between its nodes is TLS and never holds the
token, and a machine without a certificate of the cluster's CA cannot join it."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

import pytest

from tests import nscluster, sniff
from tests.conftest import cli
from tuner.cluster import join, tls
from tuner.config import ConfigError


def test_ca_and_certificates_are_private_signed_and_never_replaced(tmp_path: Path) -> None:
    from cryptography import x509

    ca_dir, node_dir = tmp_path / "ca", tmp_path / "node"
    assert cli("cluster", "ca", str(ca_dir)).returncode == 0
    key = (ca_dir / "ca.key").read_bytes()
    again = cli("cluster", "ca", str(ca_dir))  # a second CA would orphan every certificate issued
    assert again.returncode == 2 and "exists" in again.stderr and (ca_dir / "ca.key").read_bytes() == key
    made = cli("cluster", "cert", str(node_dir), "--ca", str(ca_dir), "--ip", "10.1.2.3")
    assert made.returncode == 0, made.stderr
    assert f"export RAY_TLS_SERVER_KEY={node_dir / 'node.key'}" in made.stdout and "BEGIN" not in made.stdout
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in [ca_dir, node_dir, *ca_dir.iterdir(), *node_dir.iterdir()]
    }
    assert modes == {"ca": 0o700, "node": 0o700, "ca.key": 0o600, "ca.crt": 0o644,
                     "node.key": 0o600, "node.crt": 0o644}  # fmt: skip
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((node_dir / "node.crt").read_bytes())
    cert.verify_directly_issued_by(ca)  # raises if another key signed it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.1.2.3") in names.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert (node_dir / "ca.crt").read_bytes() == (ca_dir / "ca.crt").read_bytes()


def _authority(valid_from_days: float, valid_to_days: float) -> tls.Authority:
    """A CA whose certificate is valid from/to these many days from now (negative: past)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "old CA")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=valid_from_days))
        .not_valid_after(now + datetime.timedelta(days=valid_to_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return tls.Authority(cert.public_bytes(serialization.Encoding.PEM), key)


@pytest.mark.parametrize(
    ("valid", "said"),
    [((-30, -1), "expired on"), ((2, 30), "not valid before")],
    ids=["expired", "not-yet-valid"],
)
def test_cert_with_a_ca_out_of_its_dates_is_refused_in_one_line(
    tmp_path: Path, valid: tuple[int, int], said: str
) -> None:
    """Every peer would refuse what such a CA signs: no certificate is issued, no directory made."""
    ca_dir, node_dir = tmp_path / "ca", tmp_path / "node"
    _authority(*valid).save(ca_dir)
    out = cli("cluster", "cert", str(node_dir), "--ca", str(ca_dir))
    assert out.returncode == 2 and out.stdout == "", out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --ca: {ca_dir}: ") and said in lines[0], lines
    assert not node_dir.exists()


def test_cert_from_a_ca_that_ends_soon_ends_with_it(tmp_path: Path) -> None:
    from cryptography import x509

    ca_dir, node_dir = tmp_path / "ca", tmp_path / "node"
    authority = _authority(-1, 10)
    authority.save(ca_dir)
    out = cli("cluster", "cert", str(node_dir), "--ca", str(ca_dir))
    assert out.returncode == 0 and "the CA expires on" in out.stderr, out
    cert = x509.load_pem_x509_certificate((node_dir / "node.crt").read_bytes())
    assert abs((cert.not_valid_after_utc - authority.valid()[1]).total_seconds()) < 60


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory):
    cluster = nscluster.NsCluster(workers=1, cpus=1, tls=True, base=tmp_path_factory.mktemp("tls"))
    try:
        cluster.start()
    except nscluster.Unavailable as why:
        pytest.skip(f"no namespaced cluster here: {why}")
    yield cluster
    cluster.stop()


@pytest.mark.slow
def test_a_sweep_on_a_tls_cluster_sends_nothing_in_clear(tls_cluster: nscluster.NsCluster) -> None:
    c = tls_cluster
    head, w1 = c.head, c.nodes[1]
    for node in c.nodes:  # keys private on every node
        assert c.run(node, ["stat", "-c", "%a", f"{nscluster.TLS_DIR}/node.key"]).stdout.strip() == "600"
    # Two trials at once on 1 CPU per node: one runs on w1, so the driver on the head, its
    # trials, their results and Ray's control traffic all cross the link between the nodes.
    # Trials of 8 s (nscluster.sleeping_sweep): long enough for w1's actor to start first.
    c.put(head, "/tmp/work/tls.yaml", nscluster.sleeping_sweep("tls"))
    with sniff.Capture([head.veth, w1.veth]) as cap:
        out = c.run(
            head,
            ["python", "-m", "tuner", "sweep", "tls.yaml", "--address", c.gcs, "--output", "/tmp/work/runs"],
            timeout=400,
        )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sweep = head.path("/tmp/work/runs/tls")
    ran_on = {line for r in sweep.glob("*/result.json") for line in r.read_text().splitlines()}
    assert any(f'"node_ip": "{w1.ip}"' in line for line in ran_on), "no trial ran on w1"
    between = {f: d for f, d in cap.flows().items() if {f.src, f.dst} == {head.ip, w1.ip}}
    assert len(between) >= 4, sorted(between)  # the GCS, raylets, workers, object transfers
    clear = sorted(
        f"{f.src}:{f.sport}->{f.dst}:{f.dport} {d[:24]!r}" for f, d in between.items() if not sniff.is_tls(d)
    )
    assert not clear, clear
    token = c.token.encode()
    assert not any(token in d for d in between.values())


@pytest.mark.slow
def test_a_machine_without_the_clusters_certificate_cannot_join(tls_cluster: nscluster.NsCluster) -> None:
    c = tls_cluster
    assert c.head.alive()
    # Both strangers know the token: only TLS stands in their way. Each gives up after 5 s
    # without the head's GCS (Ray's default: 60 s), so the test need not watch them a minute.
    foreign = tls.new_authority("another CA")
    give_up = {"RAY_gcs_rpc_server_reconnect_timeout_s": "5"}
    strangers = [
        c.boot_stranger("plain", (), give_up),
        c.boot_stranger(
            "foreign", (*foreign.issue_pem("foreign", [], ["foreign"]), foreign.cert_pem), give_up
        ),
    ]
    target = join.target(c.gcs)
    assert target is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(s.alive() for s in strangers):
        ips = {n.node_manager_address for n in join.gcs_nodes(target, c.token, c.host_tls)}
        assert ips == {n.ip for n in c.nodes}, ips  # never joined
        time.sleep(2)
    ips = {n.node_manager_address for n in join.gcs_nodes(target, c.token, c.host_tls)}
    assert ips == {n.ip for n in c.nodes}, ips
    # A driver here without TLS is told so in one line, before Ray starts.
    with pytest.raises(ConfigError, match="speaks TLS and this process does not"):
        join.probe(target, c.token)
    # With the cluster's files it joins (the check tuner sweep --address makes).
    assert sorted(join.probe(target, c.token, c.host_tls) or []) == sorted(n.ip for n in c.nodes)
    # The control: a machine with a certificate of the cluster's CA joins.
    friend = c.boot_stranger(
        "friend", (*c.authority.issue_pem("friend", [], ["friend"]), c.authority.cert_pem)
    )
    c.wait_ready(len(c.nodes) + 1, dashboard=False)
    assert friend.ip in {n.node_manager_address for n in join.gcs_nodes(target, c.token, c.host_tls)}
