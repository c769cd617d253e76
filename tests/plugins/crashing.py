"""Tuners whose worker dies by SIGKILL, as under the OOM killer or an operator's `kill -9`
(`--tuner plugins.crashing:NAME`, tests/ on PYTHONPATH). Which worker: the one pinned to the GPU
KILL_ON_GPU names (its ROCR_VISIBLE_DEVICES, as the supervisor sets it).

`KilledOnce` kills its worker in the middle of its first job, once per test (the first to
create KILL_MARK); every other job sleeps SLEEP_S seconds. `Dying` kills its worker as it
starts, every time: a worker the supervisor can never keep running.
"""

from __future__ import annotations

import os
import signal

from mlirtuna.tuners.sleep import SleepTuner


def _on_the_gpu() -> bool:
    return os.environ.get("ROCR_VISIBLE_DEVICES") == os.environ["KILL_ON_GPU"]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KilledOnce(SleepTuner):
    def tune(self, problem, ctx):
        if _on_the_gpu():
            try:  # O_EXCL: one process ever creates it, so one worker dies, once
                os.close(os.open(os.environ["KILL_MARK"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                _die()
        return super().tune(problem, ctx)


def KilledOnce():
    return _KilledOnce(float(os.environ.get("SLEEP_S", "0")))


def Dying():
    if _on_the_gpu():
        _die()
    return SleepTuner(float(os.environ.get("SLEEP_S", "0")))
