"""A sweep directory in object storage (`output: s3://bucket/prefix`): checked before Ray starts.

The endpoint and credentials come from the environment the standard way (AWS_ENDPOINT_URL or
AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance
role): botocore's own chain, so tuner agrees with every other AWS tool on the machine. No
message here names a credential; an endpoint is shown without any user:password in it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tuner.errors import ConfigError

CHECK_TIMEOUT_S = 5.0  # connect and read, per attempt: an unreachable endpoint answers nothing
# Error codes of S3 (and of S3-compatible servers) that mean "these credentials are refused".
_REFUSED = {
    "InvalidAccessKeyId": "the access key is not known there",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "InvalidToken": "the session token is not valid",
    "ExpiredToken": "the session token has expired",
    "AccessDenied": "these credentials may not list the bucket",
    "403": "access denied",
}
S3_EXTRA = "pip install 'tuner[s3]'"


def is_uri(output: str) -> bool:
    return "://" in output


def check_output(output: str) -> None:
    """Refuse, as a ConfigError on `output` (one line), an s3:// output that the sweep could not
    write: no client library, an endpoint that does not answer, a bucket that does not exist,
    credentials missing or refused. Other URIs are left to Ray."""
    parts = urlsplit(output)
    if parts.scheme != "s3":
        return
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not bucket:
        raise ConfigError("output", f"{output}: no bucket (expected s3://BUCKET/PREFIX)")
    client = _client(output)
    where = _shown(client.meta.endpoint_url)
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except (NoCredentialsError, PartialCredentialsError):
        raise ConfigError(
            "output",
            f"{output}: no S3 credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE)",
        ) from None
    except EndpointConnectionError:
        raise ConfigError("output", f"{output}: the S3 endpoint {where} does not answer{_hint()}") from None
    except ClientError as err:
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            raise ConfigError("output", f"{output}: bucket '{bucket}' does not exist at {where}") from None
        if code in _REFUSED:
            raise ConfigError(
                "output", f"{output}: {where} refused the credentials ({code}: {_REFUSED[code]})"
            ) from None
        raise ConfigError("output", f"{output}: {where} answered {code or 'an error'}") from None
    except BotoCoreError as err:  # timeouts, bad endpoint URLs, ...: one line, its class and text
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError("output", f"{output}: cannot use the S3 endpoint {where}: {first}") from None


def _client(output: str) -> Any:
    try:
        import botocore.session
        from botocore.config import Config
    except ImportError:
        raise ConfigError("output", f"{output}: S3 output needs botocore and s3fs: {S3_EXTRA}") from None
    config = Config(
        connect_timeout=CHECK_TIMEOUT_S,
        read_timeout=CHECK_TIMEOUT_S,
        retries={"max_attempts": 2, "mode": "standard"},
    )
    session = botocore.session.get_session()
    try:
        # An S3-compatible server knows no regions; botocore needs one to sign with.
        region = session.get_config_variable("region") or "us-east-1"
        return session.create_client("s3", region_name=region, config=config)
    except Exception as err:  # noqa: BLE001 - a malformed endpoint or profile: say which
        raise ConfigError("output", f"{output}: cannot set up an S3 client: {err}") from None


def _shown(url: str) -> str:
    """An endpoint URL without any user:password it may carry."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _hint() -> str:
    import os

    if os.environ.get("AWS_ENDPOINT_URL_S3"):
        return " (AWS_ENDPOINT_URL_S3)"
    if os.environ.get("AWS_ENDPOINT_URL"):
        return " (AWS_ENDPOINT_URL)"
    return ""
