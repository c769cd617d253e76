"""Start-up of the CLI: `mlirtuna --help` and `mlirtuna status`, each a fresh process.

Run (from the repository root):

    .venv/bin/python bench/bench_startup.py [--src OTHER/src] [--repeat 10]

Per command: the CPU time of the process (user + sys; the least of --repeat runs, the figure
that a busy shared machine disturbs least), its wall time (least of the runs), the total of
`python -X importtime` over top-level imports, and which heavy packages it loads at all.
`--src` measures another checkout's sources (e.g. a commit before a change) the same way;
`status` runs on a new SQLite database made by that checkout's `db upgrade`.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (("--help",), ("status",))
HEAVY = ("numpy", "alembic", "sqlalchemy", "rich", "rich.live", "mlirtuna.tuners")
_IMPORT = re.compile(r"import time:\s+\d+ \|\s+(\d+) \|( +)(\S+)")


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU s, wall s) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def imports(argv: list[str], env: dict[str, str]) -> tuple[float, list[str]]:
    """Seconds of top-level imports, and the heavy packages among all imports."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True
    )
    total, loaded = 0, set()
    for match in _IMPORT.finditer(proc.stderr):
        cumulative, indent, name = match.groups()
        if len(indent) == 1:
            total += int(cumulative)
        loaded.update(h for h in HEAVY if name == h)
    return total / 1e6, sorted(loaded)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the sources to measure")
    ap.add_argument("--repeat", type=int, default=10, help="runs per command [10]")
    args = ap.parse_args(argv)
    repeat = 2 if args.smoke else args.repeat
    env = dict(os.environ, PYTHONPATH=str(args.src))
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlirtuna-startup-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'startup.db'}"
        base = [sys.executable, "-m", "mlirtuna", "--db", db]
        subprocess.run([*base, "db", "upgrade"], env=env, capture_output=True, check=True)
        for command in COMMANDS:
            runs = [run_once([*base, *command], env) for _ in range(repeat)]
            seconds, heavy = imports([*base, *command], env)
            rows.append(
                (
                    f"mlirtuna {' '.join(command)}",
                    f"{min(c for c, _ in runs):.2f}",
                    f"{min(w for _, w in runs):.2f}",
                    f"{seconds:.2f}",
                    ", ".join(heavy) or "none",
                )
            )
    text = "\n".join(
        [
            common.machine_line(),
            "",
            f"Sources: {args.src}; least of {repeat} runs.",
            "",
            common.table(
                ("command", "CPU s", "wall s", "imports s (-X importtime)", "heavy packages"),
                rows,
            ),
        ]
    )
    common.emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
