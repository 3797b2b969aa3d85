"""`python -m queueplane` runs the CLI."""

import sys

from queueplane.cli import main

sys.exit(main())
