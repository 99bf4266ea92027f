"""A script that ran out of memory: recognised by what torch printed, run again with less.

torch's allocators say so in the exception a script dies of (`torch.OutOfMemoryError: CUDA out
of memory. Tried to allocate ...`; the CPU's and older paths: a RuntimeError in their words),
printed on its stderr; a script that catches it and exits on its own still printed it. That is
the trial's `oom`, a result like tuner's loop's, not an error. With `failure.oom_retries` left
and a batch-size placeholder in the command (`{batch_size}`, or any whose name ends in
`batch_size`), the script runs again from its last checkpoint with those values halved: the
script's own batch, so unlike tuner's micro-batch back-off the effective batch changes too,
which the trial's record says.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Optional

from tuner.config.placeholders import placeholders
from tuner.trial.frame.memory import OOM_WORDS

# torch's messages (the allocators' words, as the loop reads them in its exceptions) and the
# exception's own name (torch.OutOfMemoryError, torch.cuda.OutOfMemoryError).
OOM = re.compile(rf"OutOfMemoryError|{OOM_WORDS}", re.IGNORECASE)


def ran_out(cause_line: Optional[str], stderr_tail: Iterable[str]) -> Optional[str]:
    """The line that says the script ran out of memory: its exception's, else the last line of
    stderr's end that says so; None when neither does."""
    if cause_line and OOM.search(cause_line):
        return cause_line
    said = [ln.strip() for ln in stderr_tail if OOM.search(ln)]
    return said[-1] if said else None


def batch_placeholders(command: Any) -> list[str]:
    """The command's placeholders that are a batch size: `batch_size`, or a name ending in it."""
    return [name for name in placeholders(command) if name.lower().endswith("batch_size")]


def halved(params: dict[str, Any], names: list[str]) -> Optional[dict[str, Any]]:
    """`params` with each of `names` halved (whole numbers); None when there is none to halve,
    or one is already 1 (or not a whole number)."""
    out = dict(params)
    for name in names:
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            return None
        out[name] = value // 2
    return out if names else None
