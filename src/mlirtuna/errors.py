"""The one exception hierarchy of mlirtuna.

`UserError` subclasses are problems the user can fix (a bad config line, a bad URL, a missing
build dir): the CLI prints their message as one line and exits 2. Anything else is a bug or a
runtime failure and is reported as such.
"""

from __future__ import annotations


class MlirtunaError(Exception):
    """Something went wrong in mlirtuna."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class UserError(MlirtunaError):
    """A problem with the input that the user can fix."""

    exit_code = 2


class InputError(UserError):
    """A bad line in an input file; the message starts with FILE:LINE."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        self.path, self.line, self.detail = path, line, message
        where = f"{path}:{line}: " if path is not None and line is not None else ""
        super().__init__(f"{where}{message}")

    def at(self, path: str, line: int) -> InputError:
        """The same error, placed at FILE:LINE."""
        return InputError(self.detail, path, line)


class DatabaseError(UserError):
    """The database cannot be used (unreachable, bad URL, schema too old)."""


class DatabaseUnavailable(DatabaseError):
    """The database is away for now (restarting, unreachable, locked): waiting may cure it."""


class SchemaOutdated(DatabaseError):
    """The database schema is older than this mlirtuna; run `mlirtuna db upgrade`."""


class NotFound(UserError):
    """A session, job or problem that does not exist."""


class RecordConflict(MlirtunaError):
    """A job's record clashes with a row already in the database (a result for its session and
    problem that its own record did not write): the job fails, never the worker."""


class TunerError(MlirtunaError):
    """The tuner failed on one job: the job is retried or ends in error, never lost.

    `detail` holds extra text kept in job.result (e.g. the tail of the tool's stderr).
    """

    def __init__(self, message: str, detail: str = "") -> None:
        self.detail = detail
        super().__init__(message)


class TunerTimeout(TunerError):
    """The tuner ran past the job timeout and was stopped."""


class NotRun(TunerError):
    """A batch's tool stopped before it tuned this problem: nothing is known against it, so its
    job is given back (no retry counted) rather than failed."""


class BatchRefused(TunerError):
    """A batch's tool failed the whole call before it tuned any config (rocMLIR's tuningRunner
    parses every config line first: one it cannot parse fails them all). Nothing is known
    against any one job: each is tuned alone instead, no retry counted."""


class StreamBroken(TunerError):
    """A long-lived benchmark process (StreamingTuner) exited, or could not be fed: the job it
    was on failed (a retry counted, as a tool crash), the jobs fed behind it are given back."""


class Unsupported(TunerError):
    """The tuner cannot run this problem at all (data type, op, layout, size): retrying cannot
    help, so the job ends in error at once."""
