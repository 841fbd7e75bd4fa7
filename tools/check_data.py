"""`detr-check-data` run from a clone (`python tools/check_data.py --help`); the command is
:mod:`detr.commands.check_data`."""

import sys

from detr.commands.check_data import main

if __name__ == "__main__":
    sys.exit(main())
