"""The rfdetr package's model code (roboflow/rf-detr), for parity tests: never a dependency of this project. The
keypoint tests pass with 1.8.0 (the first with ``RFDETRKeypointPreview``) and 1.11.2; where the two differ, they
follow 1.11.2 and say so.

``make setup`` installs a copy, without its dependencies, in ``.venv/rfdetr_package`` (found here without
setting anything); elsewhere install a throwaway copy and point at it (the tests that need it skip without it)::

    pip install --no-deps --target /tmp/rfdetr_pkg rfdetr==1.8.0
    RFDETR_PACKAGE_DIR=/tmp/rfdetr_pkg pytest tests/models/test_keypoint_head.py   # or put the folder on PYTHONPATH

Only its model modules are imported, not ``rfdetr/__init__`` (which loads its training and download stack), as
benchmarks/rfdetr_package_parity.py does; ``requests`` is replaced by an empty module when missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

import pytest


def rfdetr_module(name: str) -> types.ModuleType:
    """``rfdetr.<name>`` (e.g. ``models.transformer``) of the package, or skip the test when it is not installed
    (on the path, or in the folder ``RFDETR_PACKAGE_DIR`` names) or has no keypoint model (before 1.8.0)."""
    if "rfdetr" not in sys.modules:
        locations = None
        spec = importlib.util.find_spec("rfdetr")
        if spec is not None and spec.submodule_search_locations:
            locations = list(spec.submodule_search_locations)
        else:
            root = os.environ.get("RFDETR_PACKAGE_DIR") or os.path.join(sys.prefix, "rfdetr_package")
            folder = os.path.join(root, "rfdetr")
            locations = [folder] if os.path.isdir(folder) else None
        if locations is None:
            pytest.skip("the rfdetr package is not installed: pip install --no-deps --target DIR rfdetr==1.8.0 and "
                        "set RFDETR_PACKAGE_DIR=DIR")
        if importlib.util.find_spec("requests") is None:
            sys.modules["requests"] = types.ModuleType("requests")
        package = types.ModuleType("rfdetr")
        package.__path__ = locations
        sys.modules["rfdetr"] = package
    try:
        return importlib.import_module(f"rfdetr.{name}")
    except ModuleNotFoundError as error:
        pytest.skip(f"the installed rfdetr package has no {name} ({error}): install rfdetr>=1.8.0")
