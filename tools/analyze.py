"""`detr-analyze` run from a clone (`python tools/analyze.py --help`); the command is :mod:`detr.commands.analyze`."""

import sys

from detr.commands.analyze import main

if __name__ == "__main__":
    sys.exit(main())
