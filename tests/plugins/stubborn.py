"""A tuner plugin that ignores the job timeout (`--tuner plugins.stubborn:Stubborn`): it loops
until stopped, swallowing ordinary exceptions, as a careless plugin might."""

from __future__ import annotations

import time


class _Stubborn:
    name = "stubborn"

    def tune(self, problem, ctx):
        while True:
            try:
                time.sleep(0.05)
            except Exception:  # careless on purpose
                continue


def Stubborn():
    return _Stubborn()
