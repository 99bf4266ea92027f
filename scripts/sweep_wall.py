"""The yardstick of the test suite's time (issue 50): the wall of one `tuner sweep
search_spaces/debug.yaml` on this machine now, and the full tier's wall against it.

usage: python scripts/sweep_wall.py                    the sweep's wall in seconds (one line)
       python scripts/sweep_wall.py --ratio TIER SWEEP  the line scripts/test.sh ends with

scripts/test.sh times the sweep before pytest starts (in a temporary directory, its own Ray, as
a user runs it), then prints the full tier's wall, the sweep's and their ratio. Machines differ
about 2x in speed, and the same machine with other work on it more: the ratio holds on any of
them. The goal is 100x or less.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = 100.0


def sweep_wall() -> float:
    with tempfile.TemporaryDirectory(prefix="tuner-yardstick-") as out:
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tuner", "sweep", "search_spaces/debug.yaml", "--output", out],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        took = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"[test.sh] the yardstick sweep failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return took


def ratio_line(tier_s: float, sweep_s: float) -> str:
    ratio = tier_s / sweep_s
    verdict = "within" if ratio <= GOAL else "over"
    return (
        f"[test.sh] the full tier took {tier_s:.0f} s; one `tuner sweep search_spaces/debug.yaml` "
        f"took {sweep_s:.1f} s on this machine before it: {ratio:.0f}x ({verdict} the goal of "
        f"{GOAL:.0f}x)"
    )


def main() -> None:
    if sys.argv[1:2] == ["--ratio"]:
        tier, sweep = sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
        if not sweep:
            print(f"[test.sh] the full tier took {float(tier):.0f} s (no yardstick sweep: see above)")
            return
        print(ratio_line(float(tier), float(sweep)))
        return
    print(f"{sweep_wall():.2f}")


if __name__ == "__main__":
    main()
