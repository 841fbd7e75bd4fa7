"""`detr-track` run from a clone (`python tools/track.py --help`); the command is :mod:`detr.commands.track`."""

import sys

from detr.commands.track import main

if __name__ == "__main__":
    sys.exit(main())
