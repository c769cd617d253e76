"""`mlirtuna db …`: the schema."""

from __future__ import annotations

import typer

import mlirtuna.cli.common as common
from mlirtuna.errors import UserError

app = typer.Typer(
    no_args_is_help=True, suggest_commands=False, help="Create or upgrade the database schema."
)


@app.command()
def upgrade(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print {database, before, after}."),
) -> None:
    """Apply every pending migration (creates the schema on an empty database)."""
    db = common.database(ctx, check_schema=False, create=True)
    before, after = db.upgrade()
    if as_json:
        common.print_json({"database": db.display_url, "before": before, "after": after})
    elif before == after:
        common.err(f"{db.display_url}: schema up to date ({after})")
    else:
        common.err(f"{db.display_url}: upgraded {before or 'empty'} -> {after}")


@app.command()
def current(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print {database, current, head}."),
) -> None:
    """Print the schema revision of the database and the one this mlirtuna needs."""
    from mlirtuna import migrations

    db = common.database(ctx, check_schema=False)
    now, head = db.current_revision(), migrations.head_revision()
    if as_json:
        common.print_json({"database": db.display_url, "current": now, "head": head})
    else:
        print(f"{now or 'none'} (head {head})")


@app.command()
def roles(
    ctx: typer.Context,
    prefix: str = typer.Option(
        "tuna", "--prefix", help="Role names: PREFIX_admin, _worker, _reader."
    ),
    apply: bool = typer.Option(
        False,
        "--apply",
        help="Run the SQL (as a user who may create roles) instead of printing it.",
    ),
    without_passwords: bool = typer.Option(
        False,
        "--without-passwords",
        help="Apply with MLIRTUNA_ROLE_PASSWORD_* unset: roles that exist keep their "
        "passwords; new ones log in only where the server needs none (trust, peer, certificates).",
    ),
    host: list[str] = typer.Option(
        None,
        "--host",
        metavar="NAME",
        help="A worker login of this host's own, PREFIX_worker_NAME (repeatable): a member of "
        "the worker group, so that no host can change another's login or end its connections.",
    ),
    shared_worker_login: bool = typer.Option(
        False,
        "--shared-worker-login",
        help="With --host, make the shared login PREFIX_worker too (without --host it is "
        "always made): any host on it can stop every other host on it.",
    ),
) -> None:
    """Least-privilege roles: admin (everything), worker (claim and record only), reader (SELECT).

    Passwords come from MLIRTUNA_ROLE_PASSWORD_ADMIN / _WORKER / _READER when applied; a
    host's login (--host) gets its password from the host's own `ALTER ROLE … PASSWORD`."""
    from mlirtuna.db import roles as roles_api

    db = common.database(ctx)
    given = tuple(host or ())
    found = tuple(h for h in roles_api.existing_hosts(db, prefix) if h not in given)
    if found:
        common.err(f"hosts with a worker login already: {', '.join(found)} (granted again)")
    hosts = given + found
    shared = roles_api.shared_login(hosts, shared_worker_login or None)
    if not shared:
        common.err(
            f"no shared login {prefix}_worker: each host logs in as its own "
            "(--shared-worker-login makes it; one made before keeps its grants until dropped)"
        )
    if apply:
        # A login found keeps its password unless its variable is set.
        unset = roles_api.unset_password_variables(given, shared)
        if unset and not without_passwords:
            # Roles made without a password exist, yet nobody can log in as them: say so first.
            raise UserError(
                f"db roles --apply: set {', '.join(unset)} (the roles' passwords), or add "
                "--without-passwords (roles that exist keep theirs; trust, peer or certificate "
                "logins)"
            )
        if unset:
            common.err(f"warning: {', '.join(unset)} unset: those roles get no new password")
        roles_api.apply_roles(db, prefix, hosts, shared)
        names = [*roles_api.role_names(prefix).values(), *roles_api.host_roles(prefix, hosts)]
        names = [n for n in names if shared or n != f"{prefix}_worker"]
        common.err(f"{db.display_url}: roles {', '.join(names)} ready")
        return
    for statement in roles_api.roles_sql(db, prefix, hosts=hosts, shared=shared):
        print(f"{statement};")
