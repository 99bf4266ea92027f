"""A real S3-compatible server for the tests: moto's standalone server in a process of its own.

It listens on one address (loopback, or the host's address on a namespaced cluster's
network) at a free port, and checks credentials: moto authenticates only after its first
INITIAL_NO_AUTH_ACTION_COUNT calls, which we spend on making an IAM user with an access key
and a policy. Clients get the server the standard way, from the environment
(`S3Server.env()`: AWS_ENDPOINT_URL and the key), as a user's tools would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# CreateUser, CreateAccessKey, PutUserPolicy, for tuner's user and an administrator's:
# unauthenticated; every call after them is checked.
_SETUP_CALLS = 6
_POLICY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'
_DENY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Action": "s3:*", "Resource": "*"}]}'
_ADMIN = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
REGION = "us-east-1"


@dataclass
class S3Server:
    host: str
    port: int
    proc: subprocess.Popen
    key_id: str = ""
    secret: str = ""
    admin: tuple[str, str] = ("", "")  # an administrator's key (IAM): refuse() and allow()
    _client: Any = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables a client of this server needs (and nothing else of AWS's)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, **overrides: str) -> Any:
        """A boto3 client of the server (tuner's key, or `overrides`'): made once for tuner's
        key, as a test polling the bucket would otherwise make one per call (CPU-seconds each)."""
        import boto3

        if not overrides and self._client is not None:
            return self._client
        kw = {"aws_access_key_id": self.key_id, "aws_secret_access_key": self.secret, **overrides}
        made = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, **kw)
        if not overrides:
            self._client = made
        return made

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def read(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def error_texts(self, bucket: str) -> str:
        """Every trial's error.txt in the bucket (the traceback a failed trial left), each
        under its key: for the message of an assertion that a sweep succeeded."""
        keys = [k for k in self.keys(bucket) if k.endswith("error.txt")]
        return "".join(f"\n--- {k}:\n{self.read(bucket, k).decode()[-3000:]}" for k in keys)

    def refuse(self) -> None:
        """From now on the server refuses tuner's credentials (AccessDenied), as a policy
        changed under a running sweep; `allow()` takes it back."""
        self._iam().put_user_policy(UserName="tuner", PolicyName="s3", PolicyDocument=_DENY)

    def allow(self) -> None:
        self._iam().put_user_policy(UserName="tuner", PolicyName="s3", PolicyDocument=_POLICY)

    def _iam(self) -> Any:
        import boto3

        key, secret = self.admin
        return boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start(host: str = "127.0.0.1", log: Optional[Path] = None) -> S3Server:
    """A moto S3 server on `host`, credentials checked, with an IAM user's key for clients."""
    import boto3

    port = _free_port(host)
    out = open(log, "ab") if log else subprocess.DEVNULL
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_SETUP_CALLS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # its own group: stop() ends it and anything it started
    )
    server = S3Server(host, port, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto's server exited ({proc.returncode}); log: {log}")
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not answer on {host}:{port} within 60 s") from None
                time.sleep(0.2)
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            region_name=REGION,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="tuner")
        key = iam.create_access_key(UserName="tuner")["AccessKey"]
        iam.put_user_policy(UserName="tuner", PolicyName="s3", PolicyDocument=_POLICY)
        server.key_id, server.secret = key["AccessKeyId"], key["SecretAccessKey"]
        iam.create_user(UserName="admin")
        key = iam.create_access_key(UserName="admin")["AccessKey"]
        iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=_ADMIN)
        server.admin = (key["AccessKeyId"], key["SecretAccessKey"])
    except BaseException:
        server.stop()
        raise
    return server
