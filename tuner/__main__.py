"""`python -m tuner` -> tuner.cli.main()."""

import sys

from tuner.cli import main

sys.exit(main())
