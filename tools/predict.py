"""`detr-predict` run from a clone (`python tools/predict.py --help`); the command is :mod:`detr.commands.predict`."""

import sys

from detr.commands.predict import main

if __name__ == "__main__":
    sys.exit(main())
