"""A user's module for task.train that imports a library printing a banner once per process
(as many do when first imported), then trains as tests/own_loops.py's `regress`."""

import sys

from tests.own_loops import regress

print("mylib 1.0: banner printed once per process, at import", flush=True)
print("mylib: a warning shown once per process", file=sys.stderr, flush=True)

__all__ = ["regress"]
