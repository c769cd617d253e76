"""Bundles: a compile job's output (the tool's `--compile-only` directory) on its way to the GPU.

A bundle is the directory packed as a tar and gzip-compressed. It travels without a shared file
system: in the database, as ~1 MiB rows of `bundle_chunk` (every INSERT far below MariaDB's
default max_allowed_packet of 16 MiB), or, for a session with an artifact store, as one file in
that directory (written under a temporary name and renamed, so it is whole or absent).

Visibility is the database's: a bundle row starts `complete = false` and is only read once
complete, which is set in the fenced transaction that completes its compile job and makes the
benchmark job claimable (`finish_compile`). A compile attempt that loses its lease midway never
sets it; its rows (and file) are removed by `sweep_orphans`, or at once by `discard`.
A bundle is deleted with the record of its benchmark job (`delete_with`), unless the session
keeps artifacts.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa

from mlirtuna.db import Database, db_now
from mlirtuna.db.models import BENCHMARK, NEW, RUNNING, WAITING, Bundle, BundleChunk, Job
from mlirtuna.errors import Unsupported
from mlirtuna.queue import settle
from mlirtuna.queue.claim import Lease

CHUNK_BYTES = 1 << 20
CHUNKS_PER_TRANSACTION = 8  # ~8 MiB per commit: a big bundle never becomes one huge transaction
SUFFIX = ".tar.gz"

_B, _C, _J = Bundle.__table__, BundleChunk.__table__, Job.__table__


class BundleMissing(Unsupported):
    """The benchmark job's bundle is gone (deleted, or never completed): retrying the benchmark
    cannot help; `jobs requeue` compiles it again."""


@dataclass(frozen=True)
class Packed:
    """A bundle packed into a local file, ready to store."""

    path: Path
    size: int
    sha256: str
    commit_id: str


def pack(directory: Path, dest: Path, commit_id: str) -> Packed:
    """The directory's contents as a gzip-compressed tar at `dest`, with its size and hash."""
    with tarfile.open(dest, "w:gz") as tar:
        for child in sorted(directory.iterdir()):
            tar.add(child, arcname=child.name)
    digest = hashlib.sha256()
    with open(dest, "rb") as f:
        while block := f.read(CHUNK_BYTES):
            digest.update(block)
    return Packed(dest, dest.stat().st_size, digest.hexdigest(), commit_id)


def unpack(data: bytes | Path, dest: Path) -> None:
    """Unpack a bundle into `dest`; the "data" filter refuses absolute paths, `..` and links
    out of the directory (a bundle is data from the database, not trusted code)."""
    dest.mkdir(parents=True, exist_ok=True)
    if isinstance(data, Path):
        with tarfile.open(data, "r:gz") as tar:
            tar.extractall(dest, filter="data")
        return
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")


# -- storing (compile worker) -------------------------------------------------------------------


def store(db: Database, lease: Lease, packed: Packed, artifact_store: str | None) -> int | None:
    """Write a packed bundle, not yet visible; its id, or None when the lease was lost meanwhile
    (then nothing of it is left behind)."""
    sweep_orphans(db, lease.session_id)
    path = _file_name(artifact_store, lease) if artifact_store else None
    with db.session(immediate=True) as s:
        if not _still_held(s.connection(), lease):
            return None
        inserted = s.execute(
            sa.insert(_B).values(
                session_id=lease.session_id,
                problem_id=lease.problem_id,
                job_id=lease.job_id,
                lease_token=lease.token,
                commit_id=packed.commit_id,
                size=packed.size,
                sha256=packed.sha256,
                path=str(path) if path else None,
                complete=False,
                created_at=db_now(),
            )
        )
        # An INSERT's result is a CursorResult with the new row's key (Session.execute is typed
        # as returning a plain Result, inserted_primary_key as optional).
        bundle_id = cast(Any, inserted).inserted_primary_key[0]
    if path is not None:
        _write_file(packed.path, path)
        return bundle_id
    if not _store_chunks(db, lease, bundle_id, packed.path):
        discard(db, bundle_id)
        return None
    return bundle_id


def _file_name(artifact_store: str, lease: Lease) -> Path:
    name = f"s{lease.session_id}-p{lease.problem_id}-j{lease.job_id}-{lease.token[:12]}{SUFFIX}"
    return Path(artifact_store) / name


def _write_file(src: Path, dest: Path) -> None:
    """Copy under a temporary name, flush to disk, rename: a reader sees all of it or nothing."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    with open(src, "rb") as f, open(tmp, "wb") as out:
        while block := f.read(CHUNK_BYTES):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, dest)


def _store_chunks(db: Database, lease: Lease, bundle_id: int, src: Path) -> bool:
    """The file as numbered chunks, a few per transaction, each transaction fenced: a compile
    attempt that lost its lease stops writing at the next one."""
    seq = 0
    with open(src, "rb") as f:
        while True:
            blocks = [b for b in (f.read(CHUNK_BYTES) for _ in range(CHUNKS_PER_TRANSACTION)) if b]
            if not blocks:
                return True
            with db.session(immediate=True) as s:
                conn = s.connection()
                if not _still_held(conn, lease):
                    return False
                for block in blocks:  # one chunk per statement: each far below 16 MiB
                    conn.execute(sa.insert(_C).values(bundle_id=bundle_id, seq=seq, data=block))
                    seq += 1


def _still_held(conn: sa.Connection, lease: Lease) -> bool:
    """Whether the lease still holds; on servers the job row is locked until commit, so the
    lease cannot expire and its bundle be swept while this transaction writes."""
    stmt = sa.select(_J.c.id).where(
        _J.c.id == lease.job_id, _J.c.lease_token == lease.token, _J.c.state == RUNNING
    )
    if conn.dialect.name != "sqlite":
        stmt = stmt.with_for_update()
    return conn.execute(stmt).first() is not None


def finish_compile(db: Database, lease: Lease, bundle_id: int, output: str) -> bool:
    """In one fenced transaction: the compile job completed, its bundle complete, the benchmark
    job claimable. False (and the bundle removed) when the lease was lost."""

    def visible(conn: sa.Connection) -> None:
        conn.execute(sa.update(_B).where(_B.c.id == bundle_id).values(complete=True))
        conn.execute(
            sa.update(_J)
            .where(
                _J.c.session_id == lease.session_id,
                _J.c.problem_id == lease.problem_id,
                _J.c.stage == BENCHMARK,
                _J.c.state == WAITING,
            )
            .values(state=NEW, not_before=None)
        )

    if settle.complete(db, lease, output, visible):
        return True
    discard(db, bundle_id)
    return False


def discard(db: Database, bundle_id: int) -> None:
    """Remove a bundle that will never be complete (its attempt lost the lease)."""
    with db.session(immediate=True) as s:
        paths = _delete(s.connection(), sa.and_(_B.c.id == bundle_id, _B.c.complete.is_(False)))
    remove_files(paths)


def sweep_orphans(db: Database, session_id: int) -> int:
    """Remove incomplete bundles whose compile attempt no longer holds its job (killed, lease
    expired, given back): they can never complete."""
    holder = sa.select(_J.c.id).where(
        _J.c.id == _B.c.job_id, _J.c.lease_token == _B.c.lease_token, _J.c.state == RUNNING
    )
    orphan = sa.and_(_B.c.session_id == session_id, _B.c.complete.is_(False), ~holder.exists())
    with db.session(immediate=True) as s:
        paths = _delete(s.connection(), orphan)
    remove_files(paths)
    return len(paths)


def _delete(conn: sa.Connection, where) -> list[str | None]:
    """Delete the bundles matching `where`, chunks first; their files' paths (None for a
    bundle in the database), to remove after the commit."""
    rows = conn.execute(sa.select(_B.c.id, _B.c.path).where(where)).all()
    if rows:
        ids = [r.id for r in rows]
        conn.execute(sa.delete(_C).where(_C.c.bundle_id.in_(ids)))
        conn.execute(sa.delete(_B).where(_B.c.id.in_(ids)))
    return [r.path for r in rows]


def remove_files(paths: list[str | None]) -> None:
    for path in paths:
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


# -- fetching (GPU worker) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Fetched:
    bundle_id: int
    commit_id: str
    data: bytes


def fetch(db: Database, session_id: int, problem_id: int) -> Fetched:
    """The complete bundle of a problem, its size and SHA-256 checked; BundleMissing when there
    is none or when its bytes are not what was stored (then the bundle is removed, so that a
    requeue compiles it again)."""
    with db.session() as s:
        row = s.execute(
            sa.select(_B)
            .where(
                _B.c.session_id == session_id,
                _B.c.problem_id == problem_id,
                _B.c.complete.is_(True),
            )
            .order_by(_B.c.id.desc())
            .limit(1)
        ).first()
        if row is None:
            raise BundleMissing(
                f"no bundle for problem {problem_id} of session {session_id} (deleted?): "
                "`mlirtuna jobs requeue` compiles it again"
            )
        if row.path is None:
            chunks = s.scalars(
                sa.select(_C.c.data).where(_C.c.bundle_id == row.id).order_by(_C.c.seq)
            )
            data = b"".join(chunks)
    if row.path is not None:
        try:
            data = Path(row.path).read_bytes()
        except OSError as e:
            raise BundleMissing(f"bundle {row.id}: cannot read {row.path}: {e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != row.size or digest != row.sha256:
        delete(db, row.id)
        raise BundleMissing(
            f"bundle {row.id} is damaged: {len(data)} bytes with SHA-256 {digest[:12]}…, "
            f"stored as {row.size} bytes with {row.sha256[:12]}…; removed, requeue compiles it"
        )
    return Fetched(row.id, row.commit_id, data)


def delete(db: Database, bundle_id: int) -> None:
    with db.session(immediate=True) as s:
        paths = _delete(s.connection(), _B.c.id == bundle_id)
    remove_files(paths)


def delete_with(session_id: int, problem_id: int, removed: list[str | None]):
    """An `also` for queue.record: delete the problem's bundles in its benchmark job's own
    transaction; their files' paths are put in `removed`, to remove after the commit."""

    def also(conn: sa.Connection) -> None:
        of_problem = sa.and_(_B.c.session_id == session_id, _B.c.problem_id == problem_id)
        removed[:] = _delete(conn, of_problem)  # a retried transaction: only its own

    return also


def exists(conn: sa.Connection, session_id: int, problem_id: int) -> bool:
    """Whether a complete bundle of the problem exists (requeue of a benchmark job)."""
    stmt = sa.select(_B.c.id).where(
        _B.c.session_id == session_id, _B.c.problem_id == problem_id, _B.c.complete.is_(True)
    )
    return conn.execute(stmt.limit(1)).first() is not None


def delete_session(conn: sa.Connection, session_id: int) -> list[str | None]:
    """Every bundle of a session (session delete); the files to remove after the commit."""
    return _delete(conn, _B.c.session_id == session_id)


def check_commit(commit_id: str, session_commit: str, where: str) -> None:
    """Unsupported (no retry) when a bundle was built from another rocMLIR commit than the
    session's. Either may be an abbreviated hash."""
    a, b = commit_id.strip().lower(), session_commit.strip().lower()
    if a and b and (a.startswith(b) or b.startswith(a)):
        return
    raise Unsupported(
        f"{where} was compiled by rocMLIR commit {commit_id or '(none)'}, the session's commit is "
        f"{session_commit or '(none)'}: refusing to benchmark it (compile workers must run "
        "the session's build)"
    )


__all__ = [
    "BundleMissing",
    "Fetched",
    "Packed",
    "check_commit",
    "delete",
    "delete_session",
    "delete_with",
    "discard",
    "exists",
    "fetch",
    "finish_compile",
    "pack",
    "store",
    "sweep_orphans",
    "unpack",
]
