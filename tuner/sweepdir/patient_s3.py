"""The s3fs file system Ray is handed for a sweep in object storage, patient with the store: a
module of its own, importing s3fs, so that the class pickles by name to every node.

Every call to the store (s3fs's `_call_s3`: uploads, downloads, single objects) that fails
with an outage (tuner.sweepdir.patience.outage: the endpoint does not answer, it is busy, it
refuses the credentials) is tried again with backoff for up to `patience_s` seconds, then
raises StorageUnavailable, which stops the sweep resumably. s3fs's own retries cover a second
or two and leave connection errors out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import s3fs

from tuner.errors import StorageUnavailable
from tuner.sweepdir.patience import PATIENCE_S, Waiting


class PatientS3FileSystem(s3fs.S3FileSystem):
    """s3fs that waits out an outage of the store (see the module). Pickles (to every node)
    with its patience and without credentials: each node reads its own environment."""

    # Made anew each time, never fsspec's instance made before with the same arguments: that
    # one's client kept the endpoint and credentials of the environment it was first used in
    # (a place made after they changed reached the old store).
    cachable = False

    def __init__(self, *args: Any, patience_s: float = PATIENCE_S, **kwargs: Any):
        self.patience_s = patience_s
        super().__init__(*args, **kwargs)

    async def _call_s3(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        waiting = Waiting(self.patience_s)
        while True:
            try:
                return await super()._call_s3(method, *args, **kwargs)
            except StorageUnavailable:
                raise
            except Exception as err:  # noqa: BLE001 - classified by outage(): others raised as they are
                _, delay = waiting.next_delay(err)
                await asyncio.sleep(delay)
