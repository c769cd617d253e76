"""The dashboard's routes, read from the app itself, for the tests that must cover every one of
them (safety, hostile data, wrong types): a route added later is tested by each of them without
an edit, and one whose parameters a test cannot fill fails that test, naming what it lacks.

The app's OpenAPI description is the list: every route, pages included (`/api/openapi.json`
and the static files are not routes of the app's own), each with its path and query parameters
and their types, in the form FastAPI documents for every version we support."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

import sqlalchemy as sa
from fastapi import FastAPI

from mlirtuna.db import Database
from mlirtuna.db.models import Job
from support.webfarm import Farm


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "path" or "query"
    required: bool
    integer: bool  # an id, an offset, a limit: out of a column's range it is a 400

    @property
    def needed(self) -> bool:
        return self.where == "path" or self.required


@dataclass(frozen=True)
class Route:
    path: str  # with its {parameters}
    params: tuple[Param, ...]

    @property
    def page(self) -> bool:
        """A page (HTML, or a redirect to one), not an /api/ answer."""
        return not self.path.startswith("/api/")

    def urls(self, values: Mapping[str, str | Sequence[str]], **override: str) -> Iterator[str]:
        """The route with its parameters filled from `values` (`override` first): one URL per
        combination where a name has several values. An optional query parameter without a
        value is left out; a needed one fails the test."""
        given = {**values, **override}
        missing = [p.name for p in self.params if p.needed and p.name not in given]
        assert not missing, f"{self.path}: the test has no value for {missing} (give it one)"
        used = [p for p in self.params if p.name in given]
        choices = [
            [given[p.name]] if isinstance(given[p.name], str) else given[p.name] for p in used
        ]
        for combination in itertools.product(*choices):
            path, query = self.path, {}
            for p, value in zip(used, combination, strict=True):
                if p.where == "path":
                    path = path.replace(f"{{{p.name}}}", str(value))
                else:
                    query[p.name] = str(value)
            yield f"{path}?{urlencode(query)}" if query else path

    def url(self, values: Mapping[str, str | Sequence[str]], **override: str) -> str:
        """The first of urls(): one value per name."""
        return next(self.urls(values, **override))


def _integer(schema: Mapping) -> bool:
    types = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", [])]
    return "integer" in types


def routes(app: FastAPI) -> list[Route]:
    """Every GET route of the app, in its order."""
    found = []
    for path, item in app.openapi()["paths"].items():
        get = item.get("get")
        if get is None:
            continue
        params = tuple(
            Param(p["name"], p["in"], p.get("required", False), _integer(p.get("schema", {})))
            for p in get.get("parameters", [])
        )
        found.append(Route(path, params))
    assert len(found) > 20, "the app's routes were not read"  # not an empty list by mistake
    return found


def farm_values(farm: Farm, job: int) -> dict[str, str]:
    """A real value for every parameter name a route of the app takes, from the test farm
    (tests/support/webfarm.py): a new name fails every test that walks the routes until it is
    given one here."""
    return {
        "session_id": str(farm.cpu_a),
        "problem_id": str(farm.problems[0]),
        "job_id": str(job),
        "session": str(farm.cpu_a),
        "a": str(farm.cpu_a),
        "b": str(farm.cpu_b),
        "op": "gemm",
    }


def first_job(db: Database, session_id: int) -> int:
    with db.session() as s:
        return s.scalar(sa.select(sa.func.min(Job.id)).where(Job.session_id == session_id))


def of_dashboard(db_url: str) -> list[Route]:
    """routes() of the dashboard over `db_url`, for a test that serves it elsewhere."""
    from mlirtuna.web.app import create_app, open_read_only

    ro = open_read_only(db_url)
    try:
        return routes(create_app(ro))
    finally:
        ro.dispose()
