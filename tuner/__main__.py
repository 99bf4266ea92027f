"""`python -m tuner` -> tuner.cli.main()."""

import sys

from tuner.cli import main
from tuner.cluster.connect import leave

code = main(watch=True)  # a sweep on its own Ray runs in a child this process watches
leave(code)  # a private Ray of this process's own: exit now, not after its slow shutdown
sys.exit(code)
