"""`detr-make-synthetic-coco` run from a clone (`python tools/make_synthetic_coco.py --help`); the command is
:mod:`detr.commands.make_synthetic_coco`."""

import sys

from detr.commands.make_synthetic_coco import main

if __name__ == "__main__":
    sys.exit(main())
