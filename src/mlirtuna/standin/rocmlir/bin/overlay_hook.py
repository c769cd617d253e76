"""The stand-in's one hook for a test build's overlay: a module the tests put on the tools'
PYTHONPATH (tests/support/standin_faults) and the package's build does not have. A tool imports
it by name when it is there and lets it wrap the functions the tool names as its seams:
bin/tuningRunner.py takes `standin_overlay`, the fakes below it (below/python/fake_kernels.py)
take `below_overlay`."""

from __future__ import annotations

import importlib
from types import ModuleType


def load(name: str) -> ModuleType | None:
    """The overlay module `name` when one is on the path; None in the package's build."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # the overlay is there but broken: say so, never run without it
            raise
        return None
