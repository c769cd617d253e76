"""Statements beyond Core: a JSON object built by the database, and statements compiled once
per dialect and sent at driver level (the queue's hot path)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement


class JsonObject(FunctionElement):
    """A JSON object built by the database from (name, value, name, value, …): one column for a
    whole row, where reading the row's many columns costs more on the client than the query."""

    inherit_cache = True


@compiles(JsonObject)
def _json_object(element: JsonObject, compiler, **kw) -> str:
    return f"json_object({compiler.process(element.clauses, **kw)})"  # SQLite, MariaDB/MySQL


@compiles(JsonObject, "postgresql")
def _pg_json_object(element: JsonObject, compiler, **kw) -> str:
    return f"json_build_object({compiler.process(element.clauses, **kw)})"


def json_object(columns: Iterable[sa.ColumnElement]) -> JsonObject:
    """{column name: value} of `columns`, as JSON built by the database."""
    pairs: list[sa.ColumnElement] = []
    for c in columns:
        pairs += [sa.literal_column(f"'{c.name}'"), c]
    return JsonObject(*pairs)


class Precompiled:
    """Core statements compiled once per dialect and sent at driver level.

    The queue's hot statements run once per job on every worker: executing them on the pooled
    DBAPI connection's own cursor skips SQLAlchemy's per-call cache-key generation,
    compiled-cache lookup and execution context, the cost that dominated a job (on SQLite,
    where a statement takes microseconds, the execution context alone cost more than the
    statement). Bind values still go through each column type's bind processor (SQLite stores
    datetimes as text); rows come back as the driver returns them (tuples), fetched at once.
    The engine's cursor events still fire, and driver errors are raised as SQLAlchemy's, so
    that db.faults classifies them as for any other statement.

    Several statements make a script, sent in one round trip by `run_script` (MariaDB/MySQL,
    whose connections allow multiple statements: db.engine).
    """

    def __init__(
        self, *stmts: sa.ClauseElement, edit: Callable[[int, str], str] | None = None
    ) -> None:
        """`edit(i, sql)`: the i-th statement's SQL text as sent, for what Core cannot say."""
        self.stmts, self.edit = stmts, edit
        self._compiled: dict[str, tuple[str, dict, dict]] = {}

    def run(self, conn: Connection, params: dict | list[dict]) -> DriverRows:
        """One statement (a list of parameter sets: executemany), its rows fetched."""
        sql, bound = self._prepare(conn.dialect)
        if isinstance(params, list):
            return run_at_driver(conn, sql, [bound(p) for p in params], many=True)[0]
        return run_at_driver(conn, sql, bound(params))[0]

    def run_script(self, conn: Connection, params: dict) -> list[DriverRows]:
        """Every statement's rows, the script sent in one round trip; a failing statement
        raises as `run` would (the transaction is then rolled back whole)."""
        sql, bound = self._prepare(conn.dialect)
        return run_at_driver(conn, sql, bound(params), script=True)

    def _prepare(self, dialect: sa.Dialect) -> tuple[str, Callable[[dict], dict]]:
        sql, constants, processors = self._compiled.get(dialect.name) or self._compile(dialect)

        def bound(values: dict) -> dict:
            args = {**constants, **values}
            for key, process in processors.items():
                args[key] = process(args[key])
            return args

        return sql, bound

    def _compile(self, dialect: sa.Dialect) -> tuple[str, dict, dict]:
        if dialect.positional:  # SQLite's driver also takes named parameters (:name)
            dialect = copy.copy(dialect)
            dialect.paramstyle, dialect.positional = "named", False
        texts, constants, processors = [], {}, {}
        for i, stmt in enumerate(self.stmts):
            # A DML or SELECT statement: its compiler is an SQLCompiler, which names its binds.
            compiled = cast(SQLCompiler, stmt.compile(dialect=dialect))
            text = compiled.string
            if "POSTCOMPILE" in text:
                raise AssertionError(f"statement needs per-call rendering: {text}")
            for bind, name in compiled.bind_names.items():
                if not bind.required:  # a constant (param_1 …): its own name per statement
                    unique = f"s{i}_{name}" if len(self.stmts) > 1 else name
                    text = text.replace(f"%({name})s", f"%({unique})s")
                    constants[unique] = bind.effective_value
                    name = unique
                process = bind.type._cached_bind_processor(dialect)
                if process is not None:
                    processors[name] = process
            texts.append(self.edit(i, text) if self.edit else text)
        self._compiled[dialect.name] = (";\n".join(texts), constants, processors)
        return self._compiled[dialect.name]


@dataclass(frozen=True)
class DriverRows:
    """A statement's rows, as the driver returned them, and the rows it matched (UPDATE,
    DELETE; for executemany, the driver's total)."""

    rows: list[tuple]
    rowcount: int

    def first(self) -> tuple | None:
        return self.rows[0] if self.rows else None

    def one(self) -> tuple:
        if len(self.rows) != 1:
            raise sa.exc.NoResultFound(f"expected one row, got {len(self.rows)}")
        return self.rows[0]


def run_at_driver(
    conn: Connection, sql: str, args: Any, *, many: bool = False, script: bool = False
) -> list[DriverRows]:
    """Run `sql` on the connection's DBAPI cursor: every result set's rows (several for a
    script). The cursor events fire as for Connection.execute; a driver error goes through
    the Connection's own handling (wrapped as sa.exc.DBAPIError, a dead link invalidated)."""
    cursor = conn.connection.cursor()  # the pooled DBAPI connection's own cursor
    dispatch = conn.dispatch
    if dispatch.before_cursor_execute:  # any listeners: dispatching to none costs a job's 5 %
        dispatch.before_cursor_execute(conn, cursor, sql, args, None, many)
    try:
        if many:
            cursor.executemany(sql, args)
        else:
            cursor.execute(sql, args)
        results = [_fetched(cursor)]
        while script and cursor.nextset():  # a script's later statements' errors surface here
            results.append(_fetched(cursor))
    except Exception as exc:
        conn._handle_dbapi_exception(exc, sql, args, cursor, None)  # raises the wrapped error
        raise
    finally:
        cursor.close()
    if dispatch.after_cursor_execute:
        dispatch.after_cursor_execute(conn, cursor, sql, args, None, many)
    return results


def _fetched(cursor: Any) -> DriverRows:
    # The rows first: SQLite counts an UPDATE … RETURNING's rows only once they are stepped.
    rows = list(cursor.fetchall()) if cursor.description is not None else []
    return DriverRows(rows, cursor.rowcount)


def rowcount(result: sa.Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched. Session.execute is typed as returning a Result;
    for those statements it is a CursorResult, which has the count."""
    return cast(sa.CursorResult[Any], result).rowcount
