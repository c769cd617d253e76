"""The dashboard's read models, one module per page: one session (session), one problem
(problem), one tuning's candidates (candidates), parallel coordinates (parallel), compare rows
(comparison), history and EDF (progress), on shared query pieces (query). Used by the dashboard
and open to scripts (`from mlirtuna.web import explore; explore.winners_page(...)`);
`history.winners.winners` stays the one full list the CLI prints and exports."""

from mlirtuna.web.explore.candidates import (
    CANDIDATE_SHOWS,
    CANDIDATE_SORTS,
    CANDIDATES_SHOWN,
    DROPPED_PREFIX,
    CandidateFilter,
    CandidatePage,
    CandidateRow,
    Candidates,
    TableRow,
    candidate_page,
    candidates,
    is_dropped,
    winner_rule,
)
from mlirtuna.web.explore.comparison import compare_rows, missing_rows
from mlirtuna.web.explore.parallel import PARALLEL_LIMIT, Parallel, parallel
from mlirtuna.web.explore.problem import (
    ProblemInfo,
    TrendPoint,
    problem,
    sessions_of_problem,
    trend,
)
from mlirtuna.web.explore.progress import EDF_SAMPLE, HISTORY_POINTS, Edf, History, edf, history
from mlirtuna.web.explore.query import labels, mask_numbers
from mlirtuna.web.explore.session import (
    WINNER_SORTS,
    ErrorGroup,
    Facets,
    Histogram,
    WinnerFilter,
    WinnerRow,
    WinnersPage,
    error_groups,
    facets,
    job_times,
    tflops_distribution,
    winners_page,
)

__all__ = [
    "CANDIDATES_SHOWN",
    "CANDIDATE_SHOWS",
    "CANDIDATE_SORTS",
    "DROPPED_PREFIX",
    "EDF_SAMPLE",
    "HISTORY_POINTS",
    "PARALLEL_LIMIT",
    "WINNER_SORTS",
    "CandidateFilter",
    "CandidatePage",
    "CandidateRow",
    "Candidates",
    "Edf",
    "ErrorGroup",
    "Facets",
    "Histogram",
    "History",
    "Parallel",
    "ProblemInfo",
    "TableRow",
    "TrendPoint",
    "WinnerFilter",
    "WinnerRow",
    "WinnersPage",
    "candidate_page",
    "candidates",
    "compare_rows",
    "edf",
    "error_groups",
    "facets",
    "history",
    "is_dropped",
    "job_times",
    "labels",
    "mask_numbers",
    "missing_rows",
    "parallel",
    "problem",
    "sessions_of_problem",
    "tflops_distribution",
    "trend",
    "winner_rule",
    "winners_page",
]
