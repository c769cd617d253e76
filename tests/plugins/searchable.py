"""A searchable test tuner whose first round fails as a whole (a tool that crashed once):
`FirstRoundFails` is the sleep tuner (made-up times, no sleep) but for its first `tune` call."""

from __future__ import annotations

from mlirtuna.errors import TunerError
from mlirtuna.tuners.sleep import SleepTuner


class FirstRoundFails(SleepTuner):
    def __init__(self) -> None:
        super().__init__(0.0)
        self.calls = 0

    def tune(self, problem, ctx):
        self.calls += 1
        if self.calls == 1:
            raise TunerError("tuningRunner exited 1", detail="(the tool's stderr)")
        return super().tune(problem, ctx)
