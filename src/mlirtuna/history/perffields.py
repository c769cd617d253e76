"""A perf config's named fields: the one place that splits a perf-config string into what its
numbers mean, for the dashboard's candidate table and plots (the string itself stays the key).

The family comes from keys.perf_config_format; the field names are rocMLIR's
(/work/shared/reference/rocmlir-interfaces.md, section 3, "perf_config string formats"):

- v1 accel `mPerBlock,nPerBlock,kPerBlock,mPerWave,nPerWave,kPack,forceUnroll,bCopyMore`
  (8 values) or non-accel `blockSize,mPerBlock,nPerBlock,kPerBlock,mPerThread,nPerThread` (6);
- v2 accel (9) or non-accel (7), v3 general (9), v4 (14);
- attn:v3 (13); gemm_gemm and conv_gemm tune with the attention attribute, so their perf
  configs are attn:… too;
- named configs (rocmlirTriton's `gemm:mPerBlock=64,nPerBlock=64,…`) name their own fields;
- a tuner that declares its perf configs' fields (TunerKind.perf_fields: the cpu tuner's
  `cpu:v1:mPerBlock,nPerBlock,kPerBlock`, a plugin's) is asked first, by the tuner that wrote
  the config (tuners.tuner_of); its family is the config less its values (`cpu:v1`).

A family or length the reference does not spell out (attn:v1, attn:v2, gemm:vN, v3 accel)
gets positional names `f1`, `f2`, … so nothing is guessed; a value that is not an integer is
kept as its text.
"""

from __future__ import annotations

from mlirtuna.keys import perf_config_format
from mlirtuna.tuners import registry

# (family, number of values) -> field names, in order.
LAYOUTS: dict[tuple[str, int], tuple[str, ...]] = {
    ("v1", 8): (
        "mPerBlock", "nPerBlock", "kPerBlock", "mPerWave", "nPerWave", "kPack",
        "forceUnroll", "bCopyMore",
    ),
    ("v1", 6): ("blockSize", "mPerBlock", "nPerBlock", "kPerBlock", "mPerThread", "nPerThread"),
    ("v2", 9): (
        "mPerBlock", "nPerBlock", "kpackPerBlock", "mPerWave", "mnPerXdl", "kpack",
        "splitKFactor", "forceUnroll", "bCopyMore",
    ),
    ("v2", 7): (
        "blockSize", "mPerBlock", "nPerBlock", "kPerBlock", "mPerThread", "nPerThread", "splitK",
    ),
    ("v3", 9): (
        "blockSize", "mPerBlock", "nPerBlock", "kPerBlock", "mPerThread", "nPerThread", "splitK",
        "scheduleVersion", "outputSwizzle",
    ),
    ("v4", 14): (
        "mPerBlock", "nPerBlock", "kpackPerBlock", "mPerWave", "nPerWave", "mnPerXdl", "kpack",
        "splitKFactor", "scheduleVersion", "outputSwizzle", "wavesPerEU", "gridGroupSize",
        "forceUnroll", "bCopyMore",
    ),
    ("attn:v3", 13): (
        "mPerBlockG0", "mPerBlockG1", "nPerBlockG0", "kpackPerBlock", "mPerWave", "nPerWave",
        "mnPerXdl", "kpack", "splitK", "scheduleVersion", "outputSwizzle", "wavesPerEU",
        "forceUnroll",
    ),
}  # fmt: skip

Value = int | str


def _value(text: str) -> Value:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return text


def _family_and_values(perf_config: str) -> tuple[str, str]:
    """(family as LAYOUTS names it, the comma list after the prefix)."""
    text = perf_config.strip()
    family = perf_config_format(text)
    if family in ("", "other") or family.endswith(":named"):
        return family, text
    if family == "v1":
        return family, text
    return family, text.split(":", 2 if family.count(":") else 1)[-1]


def fields(perf_config: str | None) -> dict[str, Value]:
    """The perf config's named fields, in order ({} for none, "None" or an unknown format)."""
    own = registry.perf_fields((perf_config or "").strip())
    if own is not None:
        return own
    family, rest = _family_and_values(perf_config or "")
    if family in ("", "other"):
        return {}
    if family.endswith(":named"):
        rest = rest.split(":", 1)[1]
        out: dict[str, Value] = {}
        for part in rest.split(","):
            name, eq, value = part.partition("=")
            if eq and name.strip():
                out[name.strip()] = _value(value)
        return out
    values = [_value(v) for v in rest.split(",")] if rest else []
    names = LAYOUTS.get((family, len(values))) or tuple(f"f{i}" for i in range(1, len(values) + 1))
    return dict(zip(names, values, strict=True))


def family(perf_config: str | None) -> str:
    """The family the fields were read as: v4, attn:v3, cpu:v1, gemm:named, … ("" for none)."""
    text = (perf_config or "").strip()
    if registry.perf_fields(text) is not None:  # the tuner's own layout: the config less its values
        return text.rpartition(":")[0]
    name, _ = _family_and_values(perf_config or "")
    return "" if name == "other" else name


def columns(perf_configs: list[str]) -> list[str]:
    """The field names of several perf configs, in first-seen order: a table's columns."""
    seen: dict[str, None] = {}
    for pc in perf_configs:
        for name in fields(pc):
            seen.setdefault(name, None)
    return list(seen)
