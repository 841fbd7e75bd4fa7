"""`detr-visualize-attention` run from a clone (`python tools/visualize_attention.py --help`); the command is :mod:`detr.commands.visualize_attention`."""

import sys

from detr.commands.visualize_attention import main

if __name__ == "__main__":
    sys.exit(main())
