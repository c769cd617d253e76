"""history/perffields: every perf-config family split into rocMLIR's field names
(/work/shared/reference/rocmlir-interfaces.md, section 3), unknown layouts positional."""

from __future__ import annotations

import pytest

from mlirtuna.history import perffields


@pytest.mark.parametrize(
    ("perf_config", "family", "expected"),
    [
        (
            "128,128,8,64,64,4,1,1",
            "v1",
            {"mPerBlock": 128, "nPerBlock": 128, "kPerBlock": 8, "mPerWave": 64, "nPerWave": 64,
             "kPack": 4, "forceUnroll": 1, "bCopyMore": 1},
        ),
        (
            "64,32,32,4,2,2",
            "v1",
            {"blockSize": 64, "mPerBlock": 32, "nPerBlock": 32, "kPerBlock": 4, "mPerThread": 2,
             "nPerThread": 2},
        ),
        (
            "v2:32,256,2,32,32,4,1,1,1",
            "v2",
            {"mPerBlock": 32, "nPerBlock": 256, "kpackPerBlock": 2, "mPerWave": 32,
             "mnPerXdl": 32, "kpack": 4, "splitKFactor": 1, "forceUnroll": 1, "bCopyMore": 1},
        ),
        (
            "v2:256,64,64,8,4,4,2",
            "v2",
            {"blockSize": 256, "mPerBlock": 64, "nPerBlock": 64, "kPerBlock": 8,
             "mPerThread": 4, "nPerThread": 4, "splitK": 2},
        ),
        (
            "v3:256,64,64,8,4,4,1,1,2",
            "v3",
            {"blockSize": 256, "mPerBlock": 64, "nPerBlock": 64, "kPerBlock": 8,
             "mPerThread": 4, "nPerThread": 4, "splitK": 1, "scheduleVersion": 1,
             "outputSwizzle": 2},
        ),
        (
            "v4:64,64,8,32,32,32,8,1,1,2,0,0,1,1",
            "v4",
            {"mPerBlock": 64, "nPerBlock": 64, "kpackPerBlock": 8, "mPerWave": 32,
             "nPerWave": 32, "mnPerXdl": 32, "kpack": 8, "splitKFactor": 1,
             "scheduleVersion": 1, "outputSwizzle": 2, "wavesPerEU": 0, "gridGroupSize": 0,
             "forceUnroll": 1, "bCopyMore": 1},
        ),
        (
            # attention, and gemm_gemm / conv_gemm, which tune with the attention attribute
            "attn:v3:32,32,64,8,32,32,32,4,1,1,2,0,1",
            "attn:v3",
            {"mPerBlockG0": 32, "mPerBlockG1": 32, "nPerBlockG0": 64, "kpackPerBlock": 8,
             "mPerWave": 32, "nPerWave": 32, "mnPerXdl": 32, "kpack": 4, "splitK": 1,
             "scheduleVersion": 1, "outputSwizzle": 2, "wavesPerEU": 0, "forceUnroll": 1},
        ),
        (
            "gemm:mPerBlock=64,nPerBlock=64,kPerBlock=8,waves=auto",
            "gemm:named",
            {"mPerBlock": 64, "nPerBlock": 64, "kPerBlock": 8, "waves": "auto"},
        ),
        (
            "attn:mPerBlockG0=32,mPerBlockG1=16",
            "attn:named",
            {"mPerBlockG0": 32, "mPerBlockG1": 16},
        ),
        ("cpu:v1:64,64,32", "cpu:v1", {"mPerBlock": 64, "nPerBlock": 64, "kPerBlock": 32}),
        ("cpu:attn:v1:32,64", "cpu:attn:v1", {"qBlock": 32, "kvBlock": 64}),
    ],
)  # fmt: skip
def test_each_family_gets_rocmlirs_field_names(perf_config, family, expected):
    assert perffields.family(perf_config) == family
    got = perffields.fields(perf_config)
    assert got == expected
    assert list(got) == list(expected)  # in the string's order


def test_a_layout_the_reference_does_not_spell_out_is_positional():
    # attn:v1 has 11 values whose names rocMLIR's notes do not give: nothing is guessed.
    got = perffields.fields("attn:v1:32,32,64,8,32,32,32,4,1,1,1")
    assert list(got) == [f"f{i}" for i in range(1, 12)]
    assert got["f3"] == 64
    assert perffields.fields("gemm:v5:1,2,x") == {"f1": 1, "f2": 2, "f3": "x"}
    # a v4 string of the wrong length is not forced into v4's names
    assert list(perffields.fields("v4:1,2,3")) == ["f1", "f2", "f3"]


@pytest.mark.parametrize("perf_config", ["", "None", None, "not a perf config"])
def test_no_fields_for_none_or_an_unknown_format(perf_config):
    assert perffields.fields(perf_config) == {}
    assert perffields.family(perf_config) == ""


def test_columns_union_in_first_seen_order():
    assert perffields.columns(["cpu:v1:64,64,32", "cpu:attn:v1:32,64", "None"]) == [
        "mPerBlock", "nPerBlock", "kPerBlock", "qBlock", "kvBlock"
    ]  # fmt: skip
