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
import gzip
import hashlib
import io
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa

import mlirtuna.queue.settle as settle
from mlirtuna.db import Database, db_now
from mlirtuna.db.models import (
    BENCHMARK,
    NEW,
    RUNNING,
    WAITING,
    Bundle,
    BundleChunk,
    Job,
    TuningSession,
)
from mlirtuna.errors import Unsupported
from mlirtuna.queue.claim import Lease

CHUNK_BYTES = 1 << 20
CHUNKS_PER_TRANSACTION = 8  # ~8 MiB per commit: a big bundle never becomes one huge transaction
SUFFIX = ".tar.gz"

_B, _C, _J = Bundle.__table__, BundleChunk.__table__, Job.__table__
_S = TuningSession.__table__
_TOKEN = re.compile(r"[0-9a-f]{12,32}")


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


MAX_FILE_BYTES = 1 << 30  # one unpacked file
MAX_TOTAL_BYTES = 4 << 30  # all of a bundle, unpacked
MAX_MEMBERS = 100_000
MAX_NAME = 1024  # characters of a member's name
_COPY_BYTES = 1 << 20


class BundleRefused(Unsupported):
    """A bundle that is not plain data (a link, a device, a name out of its directory, too big):
    nothing of it is written."""


def unpack(
    data: bytes | Path,
    dest: Path,
    max_file: int = MAX_FILE_BYTES,
    max_total: int = MAX_TOTAL_BYTES,
) -> None:
    """Unpack a bundle into the new directory `dest`. A bundle is data from the database, not
    trusted code, and never needs links: every member is checked before anything is written
    (regular files and directories only, strict relative names, a cap per file and in total),
    then it is unpacked into a temporary sibling that is renamed to `dest` once whole.
    BundleRefused, with nothing written, for anything else."""
    with (
        open(data, "rb") if isinstance(data, Path) else io.BytesIO(data) as raw,
        tarfile.open(fileobj=raw, mode="r:gz") as tar,
    ):
        try:
            members = _checked_members(tar, max_file, max_total)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise BundleRefused(f"bundle is not a whole tar.gz: {exc}") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            for member, parts in members:
                _extract_one(tar, member, tmp.joinpath(*parts))
            if dest.exists():
                dest.rmdir()  # an empty directory made for it; a full one is an error
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _checked_members(
    tar: tarfile.TarFile, max_file: int, max_total: int
) -> list[tuple[tarfile.TarInfo, tuple[str, ...]]]:
    """Every member with its name's parts, checked; BundleRefused at the first that is not
    plain data. Reading the headers reads (and decompresses) the archive once, bounded by the
    caps: a member over them stops it."""
    checked: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
    seen: dict[tuple[str, ...], bool] = {}  # name -> is a directory
    total = 0
    for member in tar:
        if len(checked) >= MAX_MEMBERS:
            raise BundleRefused(f"bundle has more than {MAX_MEMBERS} members")
        parts = _name_parts(member.name)
        if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            if member.size > max_file:
                raise BundleRefused(
                    f"bundle member {parts[-1]!r} is {member.size} bytes, over the cap of "
                    f"{max_file} bytes per file"
                )
            total += member.size
            if total > max_total:
                raise BundleRefused(f"bundle unpacks to over {max_total} bytes (the cap)")
        elif member.type != tarfile.DIRTYPE:
            raise BundleRefused(
                f"bundle member {'/'.join(parts)!r} is not a regular file or directory "
                f"(tar type {member.type!r}): bundles never hold links or devices"
            )
        for i in range(1, len(parts)):  # every parent is a directory, never a file
            if seen.get(parts[:i]) is False:
                raise BundleRefused(f"bundle member {'/'.join(parts)!r} is under a file")
        if parts in seen and not (seen[parts] and member.isdir()):
            raise BundleRefused(f"bundle member {'/'.join(parts)!r} appears twice")
        seen[parts] = member.isdir()
        checked.append((member, parts))
    return checked


def _name_parts(name: str) -> tuple[str, ...]:
    """The parts of a member's name: relative, no `.` or `..`, no empty part, no control
    character or backslash; BundleRefused otherwise."""
    shown = ascii(name[:80])
    if not name or len(name) > MAX_NAME:
        raise BundleRefused(f"bundle member name {shown} is empty or too long")
    if name.startswith("/") or any(ord(c) < 32 or c in "\\\x7f" for c in name):
        raise BundleRefused(f"bundle member name {shown} is absolute or has control characters")
    parts = tuple(p for p in name.rstrip("/").split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise BundleRefused(f"bundle member name {shown} is not a plain relative name")
    return parts


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    """One checked member; the file is created new (never through a link), with exactly its
    declared size read."""
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None  # a regular file
    mode = 0o755 if member.mode & 0o111 else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with source, open(os.open(target, flags, mode), "wb") as out:
        left = member.size
        while left > 0:
            block = source.read(min(_COPY_BYTES, left))
            if not block:
                raise BundleRefused(f"bundle member {target.name!r} is truncated")
            out.write(block)
            left -= len(block)


# -- storing (compile worker) -------------------------------------------------------------------


def store(db: Database, lease: Lease, packed: Packed, artifact_store: str | None) -> int | None:
    """Write a packed bundle, not yet visible; its id, or None when the lease was lost meanwhile
    (then nothing of it is left behind)."""
    sweep_orphans(db, lease.session_id)
    path = _file_name(artifact_store, lease) if artifact_store else None
    with db.session(immediate=True) as s:
        if not still_held(s.connection(), lease):
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
                in_store=path is not None,
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
    path = stored_file(
        artifact_store, lease.session_id, lease.problem_id, lease.job_id, lease.token
    )
    if path is None:
        raise Unsupported(f"artifact store {artifact_store}: a bundle's file would be outside it")
    return path


def stored_file(
    artifact_store: str | None,
    session_id: object,
    problem_id: object,
    job_id: object,
    token: object,
) -> Path | None:
    """The file of a bundle in the session's artifact store, derived from its ids; None when
    there is no store or the name would not resolve to a file right inside it. A file system
    path is never read from the database: a row (which the worker role may write) names no
    file of its own choosing, so it can make nothing be read or deleted elsewhere."""
    if not artifact_store or not isinstance(token, str) or not _TOKEN.fullmatch(token):
        return None
    try:
        ids = [int(str(v)) for v in (session_id, problem_id, job_id)]  # SQLite: any text
    except ValueError:
        return None
    root = Path(artifact_store).resolve()
    name = f"s{ids[0]}-p{ids[1]}-j{ids[2]}-{token[:12]}{SUFFIX}"
    path = (root / name).resolve()  # a symlink in the store resolves out of it: refused
    return path if path.is_relative_to(root) and path.parent == root else None


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
                if not still_held(conn, lease):
                    return False
                for block in blocks:  # one chunk per statement: each far below 16 MiB
                    conn.execute(sa.insert(_C).values(bundle_id=bundle_id, seq=seq, data=block))
                    seq += 1


def still_held(conn: sa.Connection, lease: Lease) -> bool:
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


def _delete(conn: sa.Connection, where) -> list[Path | None]:
    """Delete the bundles matching `where`, chunks first; one file per bundle (None for one in
    the database, or whose name is not in the store), to remove after the commit."""
    rows = conn.execute(
        sa.select(
            _B.c.id,
            _B.c.in_store,
            _B.c.session_id,
            _B.c.problem_id,
            _B.c.job_id,
            _B.c.lease_token,
            _S.c.artifact_store,
        )
        .join(_S, _S.c.id == _B.c.session_id, isouter=True)
        .where(where)
    ).all()
    if rows:
        ids = [r.id for r in rows]
        conn.execute(sa.delete(_C).where(_C.c.bundle_id.in_(ids)))
        conn.execute(sa.delete(_B).where(_B.c.id.in_(ids)))
    return [_row_file(r) if r.in_store else None for r in rows]


def _row_file(row: Any) -> Path | None:
    return stored_file(
        row.artifact_store, row.session_id, row.problem_id, row.job_id, row.lease_token
    )


def remove_files(paths: list[Path | None]) -> None:
    for path in paths:
        if path is not None:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
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
            sa.select(_B, _S.c.artifact_store)
            .join(_S, _S.c.id == _B.c.session_id)
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
        if not row.in_store:
            chunks = s.scalars(
                sa.select(_C.c.data).where(_C.c.bundle_id == row.id).order_by(_C.c.seq)
            )
            data = b"".join(chunks)
    if row.in_store:
        path = _row_file(row)
        if path is None:
            delete(db, row.id)
            raise BundleMissing(
                f"bundle {row.id} names no file in its session's artifact store; removed, "
                "requeue compiles it"
            )
        try:
            data = path.read_bytes()
        except OSError as e:
            raise BundleMissing(f"bundle {row.id}: cannot read {path}: {e}") from None
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


def delete_with(session_id: int, problem_id: int, removed: list[Path | None]):
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


def delete_session(conn: sa.Connection, session_id: int) -> list[Path | None]:
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
    "BundleRefused",
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
    "stored_file",
    "sweep_orphans",
    "unpack",
]
