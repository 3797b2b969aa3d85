"""`python -m queueplane.cli` runs the command line."""

import sys

from queueplane.cli.app import main

sys.exit(main())
