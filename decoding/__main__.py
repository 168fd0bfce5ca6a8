"""`python -m decoding ...`: the command line (see cli.py)."""

import sys

from .tools.cli import main

sys.exit(main())
