"""A hang guard: run code whose failure mode is never returning, and fail after a generous
deadline instead of hanging the suite. Never a speed bound (docs/ci.md "No wall-clock bounds
in a test"): the deadline is far above the normal run and far below the wrong behaviour's time
(a job timeout, a grace period, a forever), so a loaded machine cannot fail it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

GUARD_S = 60.0


def returns(fn: Callable[[], Any], guard_s: float = GUARD_S) -> Any:
    """fn()'s value (or its exception, raised here), or an AssertionError when it is still
    running after guard_s seconds. fn runs in a daemon thread: no signals, no main-thread use."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller as it is
            outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True, name="hang-guarded")
    thread.start()
    thread.join(guard_s)
    if thread.is_alive():
        raise AssertionError(f"still running after {guard_s:.0f} s (a hang guard, no speed bound)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
