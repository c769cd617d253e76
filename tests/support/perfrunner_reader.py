"""perfRunner's tuning-DB reader, rewritten for tests from the description in
shared/reference/rocmlir-interfaces.md §2a. It shares no code with mlirtuna.tuningdb on purpose:
it checks that what our writers produce is what perfRunner finds.

Three behaviours, by `version`:
- "00267dbf" (E2 era): exactly 3, 4 or 5 fields (arch, [numCU], config, perf, [tflops]); any other
  count is "Malformed" and skipped. Key (arch, config).
- "2219" (PR #2219, 2026-01): parse_tuning_db_line: 3 fields legacy; 5+ fields with a numeric
  third field v3; else 4+ fields v2. Key (arch, config).
- "2248" (PR #2248, 2026-02): the same lines, key (arch, num_cu, num_chiplets, config); fields a
  line lacks come from fallback_num_cu / fallback_num_chiplets.
"""

from __future__ import annotations

Key = tuple


def parse_tuning_db_line(entries: list[str]) -> tuple[str, str | None, str | None, str, str] | None:
    """(arch, num_cu, num_chiplets, config, perf) as strings, or None if unrecognised."""
    n = len(entries)
    if n == 3:
        arch, config, perf = entries
        return arch, None, None, config, perf
    if n >= 5 and entries[2].isdigit():
        arch, num_cu, num_chiplets, config, perf = entries[:5]
        return arch, num_cu, num_chiplets, config, perf
    if n >= 4:
        arch, num_cu, config, perf = entries[:4]
        return arch, num_cu, None, config, perf
    return None


def _parse_00267dbf(entries: list[str]) -> tuple[str, str | None, str | None, str, str] | None:
    if len(entries) == 3:
        return entries[0], None, None, entries[1], entries[2]
    if len(entries) in (4, 5):
        return entries[0], entries[1], None, entries[2], entries[3]
    return None


def read_tuning_db(
    path: str,
    version: str = "2248",
    fallback_num_cu: int | None = None,
    fallback_num_chiplets: int | None = None,
) -> dict[Key, str] | None:
    """The perfConfig per key, later lines winning; None (with a warning) if the file is missing."""
    parse = _parse_00267dbf if version == "00267dbf" else parse_tuning_db_line
    try:
        with open(path) as f:
            lines = f.readlines()
    except FileNotFoundError:
        print("Warning: Failed to find tuning database:", path)
        return None
    db: dict[Key, str] = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parsed = parse(line.split("\t"))
        if parsed is None:
            print("Warning: Malformed tuning database entry:", line)
            continue
        arch, num_cu, num_chiplets, config, perf = parsed
        if version == "2248":
            cu = int(num_cu) if num_cu is not None else fallback_num_cu
            chiplets = int(num_chiplets) if num_chiplets is not None else fallback_num_chiplets
            db[arch, cu, chiplets, config] = perf
        else:
            db[arch, config] = perf
    return db
