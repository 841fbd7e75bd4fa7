"""`detr-convert` run from a clone (`python tools/convert.py --help`); the command is :mod:`detr.commands.convert`."""

import sys

from detr.commands.convert import main

if __name__ == "__main__":
    sys.exit(main())
