"""How `pytest -n auto` (pytest-xdist) hands tests to its test processes.

xdist's own `load` scheduling hands out tests one by one. A module whose tests share one
database per backend (conftest's module_db_url: a farm, a dashboard and a browser set up for
the whole module) was then set up again in every process that drew one of its tests. Here those
tests go to one process together, as one unit of work per module and backend; every other test
is a unit of its own. xdist's `--dist loadgroup` meant to do this with marks, but it renames
test ids through an attribute pytest 9.2 no longer reads, so it groups nothing.

A shared database's parametrization id says so (`shared_id`): `test_x[sqlite@module]`, which is
all the controller sees of a test (it does not collect)."""

from __future__ import annotations

import re

from xdist.scheduler import LoadScopeScheduling

_SHARED = "@module"
_UNIT = re.compile(r"^(?P<module>[^:]+)::.*[\[-](?P<backend>\w+)" + re.escape(_SHARED) + r"[\]-]")


def shared_id(backend: str) -> str:
    """The parametrization id of a database shared by a module's tests on `backend`."""
    return backend + _SHARED


class SharedDatabaseScheduling(LoadScopeScheduling):
    """xdist's load scheduling, with one module's tests on one shared database as one unit.

    LoadScopeScheduling hands out the units with the most tests first, then the others in
    collection order (conftest puts the slow tests first)."""

    def _split_scope(self, nodeid: str) -> str:
        unit = _UNIT.match(nodeid)
        return f"{unit['module']}@{unit['backend']}" if unit else nodeid
