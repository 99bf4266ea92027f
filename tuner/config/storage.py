"""Where results go, as the sweep file or the command line names it: a directory, or a storage
URI (`s3://bucket/prefix`) read here once into its scheme, bucket and key. The handle every
reader and writer of a sweep holds (`tuner.sweepdir.place.Place`) is built from what this
returns; `output` is checked with it when the sweep file is read (`tuner validate` included).

A key is a path of names: each one a real name, never empty, `.` or `..`. Object stores keep
such keys as they are, but every local copy of the sweep (the driver's, a reader's) would
resolve them outside the place it was meant for (`s3://bkt/../../r/victim` made a driver
remove `$TMPDIR/r/victim/<name>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from tuner.errors import ConfigError

# The schemes tuner reads and writes itself, each with its handle (tuner.sweepdir.place).
SCHEMES = ("s3",)


def is_uri(where: str) -> bool:
    """Whether `where` names a place by URI (`scheme://...`) rather than a directory."""
    return "://" in where


@dataclass(frozen=True)
class StorageURI:
    """A place in object storage: `scheme://bucket/key`, the key without slashes at its ends
    ('' for the bucket's top)."""

    scheme: str
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else f"{self.scheme}://{self.bucket}"

    @property
    def path(self) -> str:
        """bucket/key: the place as a file system over the store names it (s3fs, pyarrow)."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    @property
    def name(self) -> str:
        """The last name of the key ('' for the bucket's top)."""
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> StorageURI:
        return StorageURI(self.scheme, self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def child(self, name: str) -> StorageURI:
        return StorageURI(self.scheme, self.bucket, f"{self.key}/{name}" if self.key else name)


def parse_uri(where: str, field: str = "output") -> StorageURI:
    """`where` (`s3://bucket/prefix`, slashes at its end or not) as a StorageURI; a ConfigError
    on `field` (one line) for a scheme tuner does not read, no bucket, or a key with a name
    that is empty, `.` or `..`."""
    parts = urlsplit(where)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            field,
            f"storage URIs other than s3:// are not supported yet ({scheme or where.split('://')[0]}://...): "
            "use s3:// (any S3-compatible store), a local directory, or one every node mounts",
        )
    if parts.query or parts.fragment:
        raise ConfigError(field, f"{where}: a storage URI has no ?query or #fragment")
    if not parts.netloc or parts.netloc in (".", ".."):
        raise ConfigError(field, f"{where}: no bucket (expected {scheme}://BUCKET/PREFIX)")
    key = parts.path.strip("/")
    names = key.split("/") if key else []
    bad = next((n for n in names if n in ("", ".", "..")), None)
    if bad is not None:
        shown = "an empty name (//)" if bad == "" else f"'{bad}'"
        raise ConfigError(field, f"{where}: {shown} in the key; a storage URI names each directory plainly")
    return StorageURI(scheme, parts.netloc, key)


def checked_output(output: str) -> str:
    """`output` as the sweep file keeps it: a directory as given, a URI normalised (refused in
    one line when it cannot be used; see parse_uri)."""
    return str(parse_uri(output)) if is_uri(output) else output
