"""``python -m sparkcep``: the command line (see :mod:`sparkcep.cli`)."""

import sys

from sparkcep.cli import main

sys.exit(main())
