"""`detr-make-shapes` run from a clone (`python tools/make_shapes.py --help`); the command is :mod:`detr.commands.make_shapes`."""

import sys

from detr.commands.make_shapes import main

if __name__ == "__main__":
    sys.exit(main())
