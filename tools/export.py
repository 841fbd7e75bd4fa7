"""`detr-export` run from a clone (`python tools/export.py --help`); the command is :mod:`detr.commands.export`."""

import sys

from detr.commands.export import main

if __name__ == "__main__":
    sys.exit(main())
