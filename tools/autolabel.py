"""`detr-autolabel` run from a clone (`python tools/autolabel.py --help`); the command is
:mod:`detr.commands.autolabel`."""

import sys

from detr.commands.autolabel import main

if __name__ == "__main__":
    sys.exit(main())
