"""`detr-explore` run from a clone (`python tools/explore.py --help`); the command is :mod:`detr.commands.explore`."""

import sys

from detr.commands.explore import main

if __name__ == "__main__":
    sys.exit(main())
