"""Expected errors as one line: a command that meets a checkpoint it cannot read or download, or an output
folder another run owns, prints ``error: <what and the fix>`` and exits 2; a traceback is for bugs (set
``DETR_DEBUG=1`` to see one for these too)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

#: The exit status of an expected error (argparse's for a bad command line).
EXPECTED_ERROR_STATUS = 2


def one_line_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's ``main``: an expected error (:func:`expected_errors`) is printed as one line on stderr
    and the command exits :data:`EXPECTED_ERROR_STATUS`; with ``DETR_DEBUG`` set it is raised as before."""

    @functools.wraps(main)
    def run(*args: object, **kwargs: object) -> int:
        try:
            return main(*args, **kwargs)
        except Exception as error:
            if not isinstance(error, expected_errors()) or os.environ.get("DETR_DEBUG"):
                raise
            print(f"error: {error}", file=sys.stderr)
            return EXPECTED_ERROR_STATUS

    return run


def expected_errors() -> tuple[type[Exception], ...]:
    """The errors a user meets with a correct program, each message naming the file and the fix (imported
    when an error comes, so that a command's ``--help`` does not wait for torch)."""
    from detr.checkpoints.formats import CheckpointError
    from detr.output_folder import OutputFolderError

    return (CheckpointError, OutputFolderError)
