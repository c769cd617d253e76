"""Forged bundles: the extractor writes regular files and directories with plain relative names
under its own directory, within its caps, or nothing at all (issue 23)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.rocmlir import work
from support.standin import standin_build
from support.twostage import count, problems, session

from mlirtuna.db import db_now
from mlirtuna.db.models import Bundle, Job
from mlirtuna.queue import bundles, jobs
from mlirtuna.queue.bundles import BundleRefused


def forged(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A tar.gz of exactly these members (the stdlib writes what it is given)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue())


def entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = ""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def refused(tmp_path: Path, data: bytes, **caps) -> str:
    """Unpacking is refused and nothing is written: no destination, no temporary sibling."""
    root = tmp_path / "root"
    root.mkdir()
    dest = root / "out"
    with pytest.raises(BundleRefused) as exc:
        bundles.unpack(data, dest, **caps)
    assert list(root.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]  # nothing outside either
    return str(exc.value)


def test_a_plain_bundle_unpacks_whole(tmp_path):
    data = forged([entry("problems", tarfile.DIRTYPE), entry("problems/a.mlir", data=b"x" * 10),
                   entry("index.json", data=b"{}")])  # fmt: skip
    bundles.unpack(data, tmp_path / "out")
    assert (tmp_path / "out" / "problems" / "a.mlir").read_bytes() == b"x" * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the temporary dir is gone


def test_the_cve_2025_4517_symlink_chain_writes_nothing(tmp_path):
    # The published PoC: directories with long names, each shadowed by a one-letter symlink, so
    # that the resolved path exceeds PATH_MAX and the "data" filter's realpath check is skipped;
    # then a link out of the directory and a file written through it.
    comp, steps, members, path = "d" * 247, "abcdefghijklmnop", [], ""
    for step in steps:
        members.append(entry(os.path.join(path, comp), tarfile.DIRTYPE))
        members.append(entry(os.path.join(path, step), tarfile.SYMTYPE, link=comp))
        path = os.path.join(path, comp)
    long_link = os.path.join(*steps, "l" * 254)
    members.append(entry(long_link, tarfile.SYMTYPE, link="../" * len(steps)))
    members.append(entry("escape", tarfile.SYMTYPE, link=long_link + "/../" * 2 + "outside"))
    members.append(entry("escape/pwned.pth", data=b"import os; os.system('touch /tmp/owned')"))
    message = refused(tmp_path, forged(members))
    assert "never hold links" in message


@pytest.mark.parametrize(
    "name", ["../outside", "a/../../outside", "/tmp/abs", "./x", "a//b", "a\\b", "a\x1b[2J", ""]
)
def test_names_out_of_the_directory_are_refused(tmp_path, name):
    refused(tmp_path, forged([entry("ok", data=b"1"), entry(name, data=b"x")]))


@pytest.mark.parametrize(
    "kind",
    [
        tarfile.SYMTYPE,
        tarfile.LNKTYPE,
        tarfile.CHRTYPE,
        tarfile.BLKTYPE,
        tarfile.FIFOTYPE,
        tarfile.CONTTYPE,
        tarfile.GNUTYPE_SPARSE,
    ],
)
def test_links_devices_and_fifos_are_refused(tmp_path, kind):
    target = tmp_path / "victim"  # outside: a hard link to it must not let a later file write it
    info, _ = entry("link", kind, link=str(target))
    refused(tmp_path, forged([entry("ok", data=b"1"), (info, None), entry("link", data=b"x")]))


def test_a_hardlink_to_a_member_then_written_through_is_refused(tmp_path):
    data = forged([entry("a", data=b"1"), entry("b", tarfile.LNKTYPE, link="a")])
    assert "never hold links" in refused(tmp_path, data)


def test_a_name_twice_or_a_file_under_a_file_is_refused(tmp_path):
    refused(tmp_path, forged([entry("a", data=b"1"), entry("a", data=b"2")]))
    (tmp_path / "root").rmdir()
    refused(tmp_path, forged([entry("a", data=b"1"), entry("a/b", data=b"2")]))


def test_a_decompression_bomb_is_refused_before_writing(tmp_path):
    big = forged([entry("ok", data=b"1"), entry("zeros", data=bytes(32 << 20))])
    assert len(big) < 100_000  # small compressed, 32 MiB unpacked
    assert "per file" in refused(tmp_path, big, max_file=8 << 20)
    (tmp_path / "root").rmdir()
    many = forged([entry(f"z{i}", data=bytes(4 << 20)) for i in range(8)])
    assert "over" in refused(tmp_path, many, max_total=16 << 20)


def test_a_declared_size_over_the_default_cap_is_refused_unread(tmp_path):
    # A header declaring 5 GiB, with nothing behind it: refused on the header, with the defaults.
    info = tarfile.TarInfo("huge")
    info.size = 5 << 30
    data = gzip.compress(info.tobuf(tarfile.PAX_FORMAT) + bytes(1024))
    assert "per file" in refused(tmp_path, data)


def test_garbage_and_a_truncated_bundle_are_refused(tmp_path):
    good = forged([entry("a", data=os.urandom(100_000))])
    with pytest.raises((BundleRefused, tarfile.TarError)):
        bundles.unpack(good[: len(good) // 2], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []


# -- a row names no file: paths are derived from the artifact store and the ids --------------


@pytest.fixture
def build(tmp_path, monkeypatch):
    return standin_build(tmp_path, monkeypatch, era="E4")


@pytest.fixture
def stored(db, tmp_path, build):
    """A split session with an artifact store whose one problem is compiled; and a victim file
    outside the store, which no bundle row may make anyone read or delete."""
    problems(db, tmp_path, 1)
    store = tmp_path / "artifacts"
    store.mkdir()
    sid = session(db, build, artifact_store=str(store))
    work(db, sid, build, "compile")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    return sid, store, victim


def test_a_row_naming_another_file_never_deletes_it(db, build, stored):
    sid, store, victim = stored
    (kept,) = store.glob("*.tar.gz")
    with db.session() as s:  # what a forger may write: a wrong size (no row names a file)
        s.execute(sa.update(Bundle).values(size=1))
    work(db, sid, build, "gpu", max_retries=5)
    assert victim.read_text() == "precious"
    (failed,) = jobs.list_jobs(db, sid, "error")
    assert "is damaged" in failed.first_line  # the store's own file was read and checked
    assert not kept.exists() and count(db, Bundle) == 0


def test_a_forged_token_or_id_names_no_file(db, build, stored):
    sid, store, victim = stored
    (kept,) = store.glob("*.tar.gz")
    with db.session() as s:
        s.execute(sa.update(Bundle).values(lease_token="../../victim"))
    work(db, sid, build, "gpu", max_retries=5)
    (failed,) = jobs.list_jobs(db, sid, "error")
    assert "names no file" in failed.first_line
    assert victim.read_text() == "precious" and kept.exists()  # an unnamed file stays too


def test_a_symlink_in_the_store_is_not_followed(db, build, stored):
    sid, store, victim = stored
    (kept,) = store.glob("*.tar.gz")
    kept.unlink()
    kept.symlink_to(victim)  # someone with the store's directory planted a link
    work(db, sid, build, "gpu", max_retries=5)
    (failed,) = jobs.list_jobs(db, sid, "error")
    assert "names no file" in failed.first_line
    assert victim.read_text() == "precious"


def test_sweep_and_session_delete_never_delete_a_named_file(db, build, stored):
    sid, _, victim = stored
    with db.session() as s:  # an incomplete row with a forged token: an orphan to sweep
        s.execute(sa.update(Bundle).values(complete=False, lease_token="f" * 32))
    assert bundles.sweep_orphans(db, sid) == 1
    assert victim.read_text() == "precious"
    work(db, sid, build, "compile")  # nothing left to compile; the store is unchanged
    with db.session() as s:
        s.execute(sa.insert(Bundle).values(
            session_id=sid, problem_id=s.scalar(sa.select(Job.problem_id).limit(1)),
            job_id=s.scalar(sa.select(Job.id).limit(1)), lease_token="a" * 32, commit_id="",
            size=0, sha256="", in_store=True, complete=True, created_at=db_now()))  # fmt: skip
    jobs.delete_session(db, sid, force=True)
    assert victim.read_text() == "precious"
