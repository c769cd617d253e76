"""Database URLs: which database (--db > env > default), the drivers we ship, the password from
the environment, printing a URL without its password, and telling a URL that can never work
from a server that is only away for now."""

from __future__ import annotations

import os
import socket

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from mlirtuna.defaults import ENV_DB, ENV_DB_PASSWORD
from mlirtuna.errors import DatabaseError

ENV_URL = ENV_DB
ENV_PASSWORD = ENV_DB_PASSWORD
DEFAULT_URL = "sqlite:///mlirtuna.db"

# The drivers we ship, so that plain `postgresql://` and `mysql://` URLs just work.
_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}
_BACKENDS = ("sqlite", "postgresql", "mysql", "mariadb")


def resolve_url(url: str | None = None) -> URL:
    """--db URL > env MLIRTUNA_DB > sqlite:///mlirtuna.db; the password may come from the env."""
    text = url or os.environ.get(ENV_URL) or DEFAULT_URL
    try:
        parsed = make_url(text)
        parsed.port  # noqa: B018 (a port that is not a number fails here, not at connect)
    except (ArgumentError, ValueError):
        raise DatabaseError(
            f"bad database URL {mask_text(text)!r}: expected e.g. sqlite:///mlirtuna.db, "
            "postgresql://user@host/db or mysql://user@host/db"
        ) from None
    if parsed.host and "@" in parsed.host:
        raise DatabaseError(
            f"bad database URL {mask(parsed)!r}: an @ in the user name or password must be "
            "written %40 (or give the password in the environment)"
        )
    driver = _DRIVERS.get(parsed.drivername)
    if driver:
        parsed = parsed.set(drivername=driver)
    if parsed.get_backend_name() not in _BACKENDS:
        raise DatabaseError(
            f"bad database URL {mask(parsed)!r}: unknown database {parsed.drivername!r}; "
            "give sqlite:///FILE, postgresql://user@host/db or mysql://user@host/db"
        )
    if (
        parsed.password is None
        and os.environ.get(ENV_PASSWORD)
        and parsed.get_backend_name() != "sqlite"
    ):
        parsed = parsed.set(password=os.environ[ENV_PASSWORD])
    _check_query(parsed)
    return parsed


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _check_query(url: URL) -> None:
    """Options the drivers would refuse only at connect time (PyMySQL with a traceback)."""
    bad = None
    if url.get_backend_name() == "postgresql":
        mode = url.query.get("sslmode")
        if mode is not None and mode not in _SSLMODES:
            bad = f"sslmode={mode!r} (known: {', '.join(_SSLMODES)})"
    elif url.get_backend_name() in ("mysql", "mariadb"):
        charset = url.query.get("charset")
        if charset is not None:
            from pymysql.charset import charset_by_name

            if not isinstance(charset, str) or charset_by_name(charset) is None:
                bad = f"charset={charset!r}"
    if bad:
        raise DatabaseError(f"bad database URL {mask(url)}: unknown {bad}")


def mask(url: URL) -> str:
    """The URL as it may be printed, rebuilt from its parts (scheme, user, host, port,
    database): a password shows as ***, and the query string never shows at all (psycopg takes
    `?password=`, and options may carry other secrets). The one function every place that
    shows a URL uses."""
    host = url.host.rsplit("@", 1)[-1] if url.host else url.host  # an unencoded @ in a password
    shown = URL.create(
        url.drivername,
        username=url.username,
        password="***" if url.password is not None or url.host != host else None,
        host=host,
        port=url.port,
        database=url.database,
    )
    return shown.render_as_string(hide_password=True)


def scrub(text: str, url: URL) -> str:
    """A driver's message with the URL's secrets (its password, in the URL or its query) and its
    query string replaced by ***: drivers may echo what they were given."""
    secrets = [url.password, *url.query.values(), *(url.host or "").split("@")[:-1]]
    for secret in sorted({str(x) for x in secrets if x}, key=len, reverse=True):
        if len(secret) >= 3:
            text = text.replace(secret, "***")
    return text


def mask_text(text: str) -> str:
    """Mask a password in a URL string that may not even parse."""
    try:
        return mask(make_url(text))
    except (ArgumentError, ValueError):
        # Unparseable: keep the scheme and what follows the last @, never what precedes it.
        scheme, sep, rest = text.partition("://")
        if "@" not in rest:
            return f"{scheme}{sep}{rest.split('?', 1)[0]}"
        return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1].split('?', 1)[0]}"


def password_hint(url: URL) -> str:
    """Where a login's password can come from, for a server that refused a login given none:
    our variable, or what the backend's driver reads by itself (libpq: PGPASSWORD, ~/.pgpass;
    PyMySQL reads no option file unless the URL names one)."""
    if url.get_backend_name() == "postgresql":
        elsewhere = "or PGPASSWORD, or a line in ~/.pgpass (mode 0600)"
    else:
        elsewhere = "or name an option file in the URL: ?read_default_file=~/.my.cnf"
    return f"no password was given: set {ENV_PASSWORD} ({elsewhere})"


def wrong_url(url: URL) -> str | None:
    """Why connecting to `url` can never work (a host name that does not resolve, a PostgreSQL
    server that accepts connections yet refused ours: user, password or database name), or
    None when the server may simply be away for now."""
    if url.get_backend_name() == "sqlite":
        return None
    host = url.host or "localhost"
    if not host.startswith("/"):
        try:
            socket.getaddrinfo(host, url.port or 0)
        except OSError:
            return f"unknown host {host!r}"
    if url.get_backend_name() == "postgresql":
        from psycopg import pq
        from psycopg.conninfo import make_conninfo

        _args, kwargs = sa.create_engine(url).dialect.create_connect_args(url)
        # Only libpq's own options (SQLAlchemy adds Python objects such as an adapters context).
        kwargs = {k: v for k, v in kwargs.items() if isinstance(v, str | int)}
        kwargs.setdefault("connect_timeout", 5)
        # PQping asks only "do you accept connections?", without logging in: OK means the server
        # is up, so a failed connection is our fault (auth, database name), not its.
        if pq.PGconn.ping(make_conninfo(**kwargs).encode()) == pq.Ping.OK:
            return "the server is up but refused this user, password or database"
    return None
