"""`detr-convert-data` run from a clone (`python tools/convert_data.py --help`); the command is
:mod:`detr.commands.convert_data`."""

import sys

from detr.commands.convert_data import main

if __name__ == "__main__":
    sys.exit(main())
