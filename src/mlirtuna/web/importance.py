"""Which perf-config fields matter: a random forest fitted on a session's candidates of one op
and data type (the rows of explore.parallel) and its impurity importance per field.

The model predicts log(TFlops / the problem's best TFlops) from the fields every drawn candidate
has as a number (history.perffields). scikit-learn does the work (RandomForestRegressor, fixed
seed, bounded trees and depth, at most explore.PARALLEL_LIMIT rows); it is imported here, on
the first call, so that `mlirtuna --help`, workers and the other pages never load it.

Why impurity (mean decrease in impurity, the forest's `feature_importances_`) and not
permutation importance: it comes with the fit at no extra cost, so the endpoint stays within the
page budget at the 5,000-row cap (32 trees on half-row samples: about 0.15 s there), while
permutation importance predicts the whole sample again for every field and repeat (about 70
more forest predictions for a v4 config). Its known bias
toward fields with many distinct values matters little here: every perf-config field takes a
handful of values (powers of two, flags). Fields that never change get 0 and are not fitted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import mlirtuna.web.explore as explore
from mlirtuna.db import Database

TREES = 32
MAX_DEPTH = 8
SAMPLE = 0.5  # each tree's bootstrap sample: half the rows…
HALVED_FROM = 200  # …from this many rows on (fewer: whole-size samples)
SEED = 0


@dataclass(frozen=True)
class Importance:
    """One share per perf-config field (they sum to 1 when anything varies), largest first."""

    session_id: int
    op: str
    data_type: str
    total: int  # valid candidates of that op and data type
    rows: int  # candidates fitted (at most explore.PARALLEL_LIMIT)
    method: str  # how the shares were computed, in words
    fields: list[str]
    importance: list[float]
    r2: float | None  # the forest's fit on the rows it was fitted on (None: nothing fitted)
    constant: list[str]  # fields with one value in every candidate: not ranked (Parallel)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


METHOD = (
    f"random forest ({TREES} trees on half-row samples, depth ≤ {MAX_DEPTH}, seed {SEED}) on "
    "log(TFlops / best of the problem); impurity importance"
)


def importance(
    db: Database,
    session_id: int,
    op: str,
    data_type: str = "",
    limit: int = explore.PARALLEL_LIMIT,
) -> Importance:
    """The importance of each numeric perf-config field for the session's candidates."""
    drawn = explore.parallel(db, session_id, op, data_type, limit)
    keep = [i for i, s in enumerate(drawn.score) if s > 0]
    names = list(drawn.axes)
    varying = [n for n in names if len({drawn.axes[n][i] for i in keep}) > 1]
    shares = dict.fromkeys(names, 0.0)
    r2: float | None = None
    if varying and len(keep) >= 2:
        from sklearn.ensemble import RandomForestRegressor  # only this endpoint loads it

        x = [[drawn.axes[n][i] for n in varying] for i in keep]
        y = [math.log(drawn.score[i]) for i in keep]
        forest = RandomForestRegressor(
            n_estimators=TREES,
            max_depth=MAX_DEPTH,
            max_samples=int(len(keep) * SAMPLE) if len(keep) >= HALVED_FROM else None,
            random_state=SEED,
            n_jobs=1,
        )
        forest.fit(x, y)
        shares.update(zip(varying, (float(v) for v in forest.feature_importances_), strict=True))
        r2 = float(forest.score(x, y)) if len(set(y)) > 1 else None
    ranked = sorted(names, key=lambda n: (-shares[n], names.index(n)))
    return Importance(
        session_id,
        op,
        data_type,
        drawn.total,
        len(keep),
        METHOD,
        ranked,
        [shares[n] for n in ranked],
        r2,
        drawn.constant,
    )
