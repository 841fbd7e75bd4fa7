"""`detr-serve` run from a clone (`python tools/serve.py --help`); the command is :mod:`detr.commands.serve`."""

import sys

from detr.commands.serve import main

if __name__ == "__main__":
    sys.exit(main())
