"""Statements beyond Core: a JSON object built by the database, and statements compiled once
per dialect and sent at driver level (the queue's hot path)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
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

    The queue's hot statements run once per job on every worker: executing them as SQL text
    skips SQLAlchemy's per-call cache-key generation and compiled-cache lookup, the cost that
    dominated a job. Bind values still go through each column type's bind processor (SQLite
    stores datetimes as text); result rows come back as the driver returns them.

    Several statements make a script, sent in one round trip by `run_script` (MariaDB/MySQL,
    whose connections allow multiple statements: db.engine).
    """

    def __init__(
        self, *stmts: sa.ClauseElement, edit: Callable[[int, str], str] | None = None
    ) -> None:
        """`edit(i, sql)`: the i-th statement's SQL text as sent, for what Core cannot say."""
        self.stmts, self.edit = stmts, edit
        self._compiled: dict[str, tuple[str, dict, dict]] = {}

    def run(self, conn: Connection, params: dict | list[dict]) -> sa.CursorResult:
        sql, bound = self._prepare(conn.dialect)
        if isinstance(params, list):
            return conn.exec_driver_sql(sql, [bound(p) for p in params])
        return conn.exec_driver_sql(sql, bound(params))

    def run_script(self, conn: Connection, params: dict) -> list[list[tuple]]:
        """Every statement's rows, the script sent in one round trip; a failing statement
        raises as exec_driver_sql would (the transaction is then rolled back whole)."""
        sql, bound = self._prepare(conn.dialect)
        args = bound(params)
        cursor = conn.connection.cursor()  # the pooled DBAPI connection's own cursor
        conn.dispatch.before_cursor_execute(conn, cursor, sql, args, None, False)
        try:
            cursor.execute(sql, args)
            rows = [list(cursor.fetchall())]
            while cursor.nextset():  # the later statements' errors surface here
                rows.append(list(cursor.fetchall()))
        except Exception as exc:
            conn._handle_dbapi_exception(exc, sql, args, cursor, None)  # wraps; drops dead links
            raise
        finally:
            cursor.close()
        conn.dispatch.after_cursor_execute(conn, cursor, sql, args, None, False)
        return rows

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


def rowcount(result: sa.Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched. Session.execute is typed as returning a Result;
    for those statements it is a CursorResult, which has the count."""
    return cast(sa.CursorResult[Any], result).rowcount
