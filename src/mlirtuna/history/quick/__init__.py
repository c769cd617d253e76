"""Quick-tuning lists from the farm's own history (`mlirtuna quick-list`).

What rocMLIR's quickTuningGen.py does with scattered `.debug` files, done over the candidate table:
per (arch, op, data type), each problem's best TFlops per perf config; a perf config *covers* a
problem when it reaches `threshold x best`; the list is a minimum set cover, solved as an integer
program with HiGHS (highspy; greedy only when the instance is too large, and then the list
says so). Also the per-problem top-k variant, a k-fold evaluation as rocMLIR's
analysis/tuning_eval does it (coverage@k, regret@k, TFlops(list) / TFlops(full) on held-out
problems), lists that transfer to an arch (GPU) never seen, the outputs (plain list, JSON, the
QuickTuningPerfconfigs.inc layout) and stored lists, which a session with `--tuning-space
list:NAME` tunes over.

One module per step, lowest first; groups, cover, evaluate and across import nothing of the
database (tests/test_layout.py checks it):
- groups.py    Group, History (one group's measurements), Options, GroupList (a list made)
- collect.py   the history read from the database (`histories`), each perf config read as the
               tuner that owns it means it on its problem (TunerKind.listed)
- cover.py     set cover (HiGHS ILP, greedy), top-k: one group's list (`build_one`)
- evaluate.py  every group's list (`build`), k-fold scores (`k_fold`), `geomean`
- across.py    any candidate matrix (Matrix): lists for a unit never seen, leave-one-out
- inc.py       the outputs: plain list, JSON, QuickTuningPerfconfigs.inc
- store.py     stored lists (`save`, `stored`) for `--tuning-space list:NAME`

Callers use the names below (`quick.histories`, `quick.build`, …); a module's own constants
(cover.GREEDY_ABOVE, …) are set on that module.
"""

from __future__ import annotations

from mlirtuna.history.quick.across import (
    ACROSS,
    DEFAULT_ACROSS_SIZE,
    MAKERS,
    Matrix,
    across_list,
    baseline_list,
    best_in_list,
    build_across,
    leave_one_out,
    matrix_of,
    switch_families,
    unit_scores,
)
from mlirtuna.history.quick.collect import histories
from mlirtuna.history.quick.cover import Cover, build_one, columns, greedy, set_cover, top_k
from mlirtuna.history.quick.evaluate import BUDGETS, build, geomean, k_fold
from mlirtuna.history.quick.groups import DEFAULT_THRESHOLD, Group, GroupList, History, Options
from mlirtuna.history.quick.inc import instruction_type, render_inc, render_json, render_list
from mlirtuna.history.quick.store import save, stored

__all__ = [
    "ACROSS",
    "BUDGETS",
    "DEFAULT_ACROSS_SIZE",
    "DEFAULT_THRESHOLD",
    "MAKERS",
    "Cover",
    "Group",
    "GroupList",
    "History",
    "Matrix",
    "Options",
    "across_list",
    "baseline_list",
    "best_in_list",
    "build",
    "build_across",
    "build_one",
    "columns",
    "geomean",
    "greedy",
    "histories",
    "instruction_type",
    "k_fold",
    "leave_one_out",
    "matrix_of",
    "render_inc",
    "render_json",
    "render_list",
    "save",
    "set_cover",
    "stored",
    "switch_families",
    "top_k",
    "unit_scores",
]
