"""`make demo` (`detr-demo` run from a clone, wherever the shell is); the command is :mod:`detr.commands.demo`."""

import sys
from pathlib import Path

from detr.commands.demo import main

if __name__ == "__main__":
    sys.exit(main(repository=Path(__file__).resolve().parents[1]))
