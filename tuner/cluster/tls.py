"""Encrypted cluster traffic: a certificate authority of the cluster's own, a certificate per
node, and the variables that make Ray speak TLS with them.

Ray encrypts its gRPC channels when a process has `RAY_USE_TLS=1` and the three files
`RAY_TLS_SERVER_CERT`, `RAY_TLS_SERVER_KEY` and `RAY_TLS_CA_CERT`: the GCS, raylets, object
transfers between nodes, workers talking to each other, the Ray Client server, and every
driver's calls (ray/_common/tls_utils.py, ray/_private/grpc_utils.py). Each server then asks
its callers for a certificate its CA signed (mutual TLS: `require_client_auth`), so a node or
a driver without one cannot join, and the token in each call never crosses a network in
clear. Each certificate names its node's addresses, which a caller checks.

Not covered by it (Ray 2.60): the dashboard's HTTP (job submission, its REST API), which
stays plain; reach it over loopback, an SSH tunnel or `kubectl port-forward`. And traffic
that Ray does not carry, such as torch.distributed's between the workers of one trial.

Keys are written with mode 0600 in 0700 directories and never printed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CA_CERT, CA_KEY = "ca.crt", "ca.key"
NODE_CERT, NODE_KEY = "node.crt", "node.key"
VALID_DAYS = 365
ENV_NAMES = ("RAY_USE_TLS", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")


@dataclass(frozen=True)
class Files:
    """One process's TLS files: its certificate and key, and the CA it trusts."""

    cert: Path
    key: Path
    ca: Path

    def env(self) -> dict[str, str]:
        """Ray's variables for these files (every process of a node, and a driver, needs them)."""
        return {
            "RAY_USE_TLS": "1",
            "RAY_TLS_SERVER_CERT": str(self.cert),
            "RAY_TLS_SERVER_KEY": str(self.key),
            "RAY_TLS_CA_CERT": str(self.ca),
        }

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA certificate), as gRPC's credentials take them."""
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()


def enabled(environ: Optional[dict[str, str]] = None) -> bool:
    """Whether Ray in this environment speaks TLS (Ray reads the same variable so)."""
    return (environ or os.environ).get("RAY_USE_TLS", "0").lower() in ("1", "true")


def from_env(environ: Optional[dict[str, str]] = None) -> Optional[Files]:
    """The TLS files Ray would use here, or None when TLS is off. Raises ValueError naming a
    variable that is missing or a file that cannot be read (Ray itself would fail later)."""
    env = environ or os.environ
    if not enabled(env):
        return None
    for name in ENV_NAMES[1:]:
        path = env.get(name, "")
        if not path:
            raise ValueError(f"RAY_USE_TLS is on but {name} is not set")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{name}: {path} is missing or not readable")
    cert, key, ca = (Path(env[name]) for name in ENV_NAMES[1:])
    return Files(cert, key, ca)


# ------------------------------------------------------------------ making certificates


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write(path: Path, data: bytes, private: bool) -> None:
    """Write `data` to `path` with mode 0600 (a key) or 0644, never briefly readable by others."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600 if private else 0o644)  # O_CREAT's mode is cut by the umask
    tmp.replace(path)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())  # gRPC (BoringSSL) takes P-256; quick to make


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer, public_key, days: float):
    """A certificate for `subject`, signed by `issuer` (an x509.Name), valid `days` from now."""
    from cryptography import x509

    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks of nodes differ a little
        .not_valid_after(now + datetime.timedelta(days=days))
    )


@dataclass(frozen=True)
class Authority:
    """A CA in memory: its certificate (PEM) and key (an object, written only if asked)."""

    cert_pem: bytes
    key: object

    def save(self, directory: Path) -> Path:
        """Write ca.crt and ca.key (0600) into `directory` (0700); returns ca.crt's path."""
        _private_dir(directory)
        _write(directory / CA_KEY, _pem_key(self.key), private=True)
        _write(directory / CA_CERT, self.cert_pem, private=False)
        return directory / CA_CERT

    @classmethod
    def load(cls, directory: Path) -> Authority:
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
        return cls((directory / CA_CERT).read_bytes(), key)

    def valid(self) -> tuple[datetime.datetime, datetime.datetime]:
        """(not before, not after) of the CA's certificate, in UTC."""
        from cryptography import x509

        ca = x509.load_pem_x509_certificate(self.cert_pem)
        return ca.not_valid_before_utc, ca.not_valid_after_utc

    def days_left(self, now: Optional[datetime.datetime] = None) -> float:
        """Days until the CA's certificate expires. Raises ValueError when it has expired or
        is not valid yet: every certificate it signed would be refused by every peer (gRPC
        checks the chain's dates), so none is issued."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        start, end = self.valid()
        if now >= end:
            raise ValueError(f"the CA's certificate expired on {end:%Y-%m-%d %H:%M} UTC; make a new CA")
        if now < start:
            raise ValueError(
                f"the CA's certificate is not valid before {start:%Y-%m-%d %H:%M} UTC (this machine's "
                f"clock says {now:%Y-%m-%d %H:%M} UTC)"
            )
        return (end - now).total_seconds() / 86400

    def issue(
        self, directory: Path, name: str, ips: list[str], dns: list[str], days: float = VALID_DAYS
    ) -> Files:
        """A certificate and key for one node (or driver) in `directory` (0700, key 0600), with
        the CA's certificate beside them: its addresses and names are what callers check."""
        cert, key = self.issue_pem(name, ips, dns, days)
        _private_dir(directory)
        files = Files(directory / NODE_CERT, directory / NODE_KEY, directory / CA_CERT)
        _write(files.key, key, private=True)
        _write(files.cert, cert, private=False)
        _write(files.ca, self.cert_pem, private=False)
        return files

    def issue_pem(
        self, name: str, ips: list[str], dns: list[str], days: float = VALID_DAYS
    ) -> tuple[bytes, bytes]:
        """(certificate, key) in PEM for `name` at `ips` and `dns`, signed by this CA."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization

        ca = x509.load_pem_x509_certificate(self.cert_pem)
        key = _new_key()
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dict.fromkeys(dns) if d]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips)]
        usage = [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = (
            _builder(name, ca.subject, key.public_key(), days)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # Every Ray process is both: a server to some, a caller of others.
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .sign(self.key, hashes.SHA256())  # type: ignore[arg-type]
        )
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def new_authority(name: str = "tuner cluster CA", days: int = VALID_DAYS) -> Authority:
    """A fresh CA (kept in memory until `save`)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    key = _new_key()
    cert = (
        _builder(name, _name(name), key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(key, hashes.SHA256())
    )
    return Authority(cert.public_bytes(serialization.Encoding.PEM), key)


def this_machine() -> tuple[list[str], list[str]]:
    """(IP addresses, names) of this machine, for a certificate that callers check against
    whichever of them they dial: loopback, every interface's address, the host name."""
    import psutil

    ips = ["127.0.0.1"]
    for addrs in psutil.net_if_addrs().values():
        ips += [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
    return ips, ["localhost", socket.gethostname(), socket.getfqdn()]


# ------------------------------------------------------------------ what a port speaks


def speaks_tls(host: str, port: int, timeout: float = 5.0) -> bool:
    """Whether the server at host:port answers a TLS handshake (without checking who it is):
    a Ray server with TLS on does, a plain gRPC server does not."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with context.wrap_socket(raw, server_hostname=host) as conn:
                conn.do_handshake()
        return True
    except ssl.SSLError as err:
        # A TLS server that wants a client certificate ends our handshake with an alert; a
        # plain HTTP/2 server answers with bytes that are no TLS record.
        return "ALERT" in str(err.reason or "").upper()
    except OSError:
        return False
