"""The built-in CPU tuner: real NumPy kernels, verified against a plain reference, then timed."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import tracemalloc

import numpy as np
import pytest

from mlirtuna.errors import TunerError, TunerTimeout
from mlirtuna.problems import parse
from mlirtuna.tuners.base import TuneContext
from mlirtuna.tuners.cpu import CpuTuner, harness_bytes, space
from mlirtuna.tuners.cpu.kernels import ConvOp, CpuOp, GemmOp
from mlirtuna.tuners.cpu.ops import make_op


def ctx(tuning_space: str = "quick", **kw) -> TuneContext:
    return TuneContext("gfx942", "gfx942:sramecc+:xnack-", 304, 1, tuning_space, gpu_id=-1, **kw)


def gemm(t="f32", out=None, ta=False, tb=False, to=None, g=1, m=64, n=48, k=80):
    trans_o = "" if to is None else f" -transO {str(to).lower()}"
    out = out or {"i8": "i32"}.get(t, t)
    return parse(
        "gemm",
        f"-t {t} -out_datatype {out} -transA {str(ta).lower()} -transB {str(tb).lower()}"
        f"{trans_o} -g {g} -m {m} -n {n} -k {k}",
    )


def conv(prefix="conv", d=1, f="NCHW", i="NCHW", o="NCHW", n=2, c=8, h=10, w=9, k=12, y=3, x=3,
         p=1, q=1, u=1, v=1, dh=1, dw=1, g=1):  # fmt: skip
    return parse(
        "conv",
        f"{prefix} -F {d} -f {f} -I {i} -O {o} -n {n} -c {c} -H {h} -W {w} -k {k} -y {y} -x {x} "
        f"-p {p} -q {q} -u {u} -v {v} -l {dh} -j {dw} -g {g}",
    )


def attention(t="f32", extra="", g=2, sq=70, sk=90, dqk=16, dv=24):
    return parse(
        "attention",
        f"-t {t} -transQ false -transK true -transV false -transO false -g {g} "
        f"-seq_len_q {sq} -seq_len_k {sk} -head_dim_qk {dqk} -head_dim_v {dv} {extra}",
    )


PROBLEMS = {
    "gemm-f32": gemm(),
    "gemm-f32-transposed-batched": gemm(ta=True, tb=True, to=True, g=3, m=33, n=17, k=70),
    "gemm-f16": gemm("f16", tb=True, g=2, m=40, n=72, k=100),
    "gemm-f16-f32out": gemm("f16", out="f32", ta=True, m=40, n=30, k=50),
    "gemm-bf16": gemm("bf16", g=2, m=40, n=30, k=100),
    "gemm-i8": gemm("i8", ta=True, tb=False, to=False, g=2, m=40, n=30, k=100),
    "conv-fwd-f32": conv(u=2, dw=2),
    "conv-fwd-f16-nhwc": conv("convfp16", f="NHWC", i="NHWC", o="NHWC", p=0, q=2, v=2),
    "conv-fwd-grouped-layouts": conv(f="N01GC", i="01NGC", o="NGC01", g=4, u=2, dw=2),
    "conv-fwd-depthwise": conv("convfp16", f="G0NC1", i="G0NC1", o="NGC01", c=8, k=8, g=8, u=2),
    "conv-fwd-1x1": conv(c=16, y=1, x=1, p=0, q=0),
    "conv-fwd-i8": conv("convint8", f="NHWC", i="NHWC", o="NHWC", x=2, q=0, v=2, dh=2, g=2),
    "conv-bwd-f32": conv(d=2, f="GNC01", i="NGC01", o="NHWC", h=11, q=2, u=2, v=3, dw=2, g=2),
    "conv-bwd-f16": conv("convfp16", d=2, u=2, v=2),
    "conv-wrw-f32": conv(d=4, i="NHWC", h=11, q=2, u=2, v=3, dw=2, g=2),
    "conv-wrw-f16": conv("convfp16", d=4, f="NHWC", u=2),
    "conv-wrw-bf16": conv("convbfp16", d=4),
    "attention-f32": attention(),
    "attention-f16": attention("f16"),
    "attention-bf16-causal": attention("bf16", "-causal true", sq=100, sk=60),
    "attention-f16-causal-lse-split": attention(
        "f16", "-causal true -return_lse true -split_kv 3", sq=90, sk=70
    ),
    "attention-f32-gqa-scale-bias": attention(
        "f32",
        "-num_heads_q 4 -num_heads_kv 2 -with-attn-scale true -with-attn-bias true -transBias true",
        g=1,
    ),
}


@pytest.mark.parametrize("name", PROBLEMS)
@pytest.mark.parametrize("tuning_space", ["quick", "greedy"])
def test_winner_is_the_fastest_valid_candidate(name: str, tuning_space: str) -> None:
    problem = PROBLEMS[name]
    outcome = CpuTuner(repeats=2).tune(problem, ctx(tuning_space))
    assert outcome.candidates and all(c.valid for c in outcome.candidates), outcome.output
    assert outcome.winner.valid and outcome.winner in outcome.candidates
    # The winner is the fastest of the top-k re-measurement (measured side by side).
    again = [c for c in outcome.candidates if c.remeasured]
    assert len(again) == min(3, len(outcome.candidates))
    assert outcome.winner.tflops == max(c.tflops or 0 for c in again or outcome.candidates)
    for c in outcome.candidates:
        assert c.kernel_time_ns and c.kernel_time_ns > 0
        assert c.spread is not None and c.spread.median == c.kernel_time_ns
        assert c.spread.samples + c.spread.discarded == 2
        assert c.tflops == pytest.approx(problem.flops() / c.kernel_time_ns / 1e3)
    prefix = "cpu:attn:v1:" if problem.op == "attention" else "cpu:v1:"
    assert all(c.perf_config.startswith(prefix) for c in outcome.candidates)


def test_outcome_output_and_timestamps() -> None:
    problem = gemm("f16")
    outcome = CpuTuner(repeats=2).tune(problem, ctx("quick"))
    lines = outcome.output.splitlines()
    header = [x for x in lines if x.startswith("#")]
    body = [x for x in lines if not x.startswith("#")]
    assert problem.canonical() in header[0]
    assert any("f32" in x and "f16" in x for x in header)  # says how f16 is computed
    assert len(body) == len(outcome.candidates)
    for line, cand in zip(body, outcome.candidates, strict=True):
        config, time_ns, min_ns, iqr_ns, samples, *again = line.split("\t")
        assert config == cand.perf_config and float(time_ns) == round(cand.kernel_time_ns or 0)
        assert cand.spread and float(min_ns) == round(cand.spread.min)
        assert float(iqr_ns) == round(cand.spread.iqr) and int(samples) == cand.spread.samples
        assert again == (["remeasured"] if cand.remeasured else [])
    start, end = outcome.compile_start, outcome.compile_end
    assert start is not None and end is not None
    assert start.tzinfo == dt.UTC and start <= end


def test_space_sizes_grow_with_the_tuning_space() -> None:
    for problem in (
        gemm(m=64, n=64, k=64),
        conv(c=16, k=32, h=12, w=12),
        attention(sq=128, sk=128),
    ):
        counts = {}
        for name in ("quick", "full", "greedy", "exhaustive"):
            outcome = CpuTuner(repeats=1).tune(problem, ctx(name))
            counts[name] = len(outcome.candidates)
            configs = [c.perf_config for c in outcome.candidates]
            assert len(set(configs)) == len(configs)
        assert counts["quick"] <= 8 < counts["full"] <= counts["exhaustive"], counts
        assert 1 < counts["greedy"] <= counts["full"], counts


def test_block_sizes_are_clipped_and_deduplicated() -> None:
    op = make_op(gemm(m=20, n=1, k=40))
    for name in ("quick", "full", "exhaustive"):
        blocks = space(op, name)
        assert len(set(blocks)) == len(blocks)
        assert all(mb <= 20 and nb == 1 and kb <= 40 for mb, nb, kb in blocks)
    assert space(op, "exhaustive") == list(itertools.product([16, 20], [1], [16, 32, 40]))
    big = make_op(gemm(m=4096, n=4096, k=4096))
    assert len(space(big, "quick")) == 8
    assert len(space(big, "full")) == 100
    assert len(space(big, "exhaustive")) == 252


def test_unknown_tuning_space_is_refused() -> None:
    with pytest.raises(TunerError, match="unknown tuning space"):
        CpuTuner().tune(gemm(), ctx("everything"))


def _wrong(op: CpuOp) -> None:
    """A kernel with a bug: right everywhere except one value."""
    op.run_blocked(tuple(min(64, d) for d in op.dims))
    out = op.outputs[0]
    out[(0,) * out.ndim] += 1 + 0.5 * abs(out).max()


def _lazy(op: CpuOp) -> None:
    """A kernel that forgets to write its output."""


@pytest.mark.parametrize("name", ["gemm-f32", "gemm-i8", "gemm-f16", "conv-bwd-f32",
                                  "conv-wrw-f16", "attention-f16"])  # fmt: skip
def test_a_wrong_candidate_is_rejected(name: str) -> None:
    tuner = CpuTuner(repeats=1, extra_kernels={"test:wrong": _wrong, "test:lazy": _lazy})
    outcome = tuner.tune(PROBLEMS[name], ctx("quick"))
    by_name = {c.perf_config: c for c in outcome.candidates}
    for bad in ("test:wrong", "test:lazy"):
        cand = by_name[bad]
        assert not cand.valid and cand.kernel_time_ns is None and cand.tflops is None
        assert cand.error and cand.error.startswith("wrong result")
        assert f"{bad}\tinvalid: wrong result" in outcome.output
    assert outcome.winner.perf_config.startswith("cpu:")
    if PROBLEMS[name].data_type == "i8":
        assert "values differ" in by_name["test:wrong"].error
    else:
        assert "max rel err" in by_name["test:wrong"].error


def test_a_crashing_candidate_is_invalid_not_fatal() -> None:
    def boom(op: CpuOp) -> None:
        raise RuntimeError("out of registers")

    outcome = CpuTuner(repeats=1, extra_kernels={"test:boom": boom}).tune(gemm(), ctx())
    (cand,) = [c for c in outcome.candidates if c.perf_config == "test:boom"]
    assert cand.error == "kernel failed: RuntimeError: out of registers"


def test_no_valid_candidate_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GemmOp, "run_blocked", lambda self, blocks: None)  # all tilings broken
    tuner = CpuTuner(repeats=1, extra_kernels={"test:wrong": _wrong})
    with pytest.raises(TunerError, match="no valid perf config: 4 tried, first: wrong result"):
        tuner.tune(gemm(m=64, n=64, k=64), ctx("quick"))
    with pytest.raises(TunerError) as info:
        tuner.tune(gemm(m=64, n=64, k=64), ctx("quick"))
    assert "cpu:v1:32,32,32\tinvalid: wrong result" in info.value.detail


def test_memory_guard_refuses_before_allocating() -> None:
    huge = [
        gemm(m=1_000_000, n=1_000_000, k=1_000_000),
        conv(n=1024, c=4096, h=4096, w=4096, k=4096),
        attention("f16", g=64, sq=1_000_000, sk=1_000_000),
    ]
    for problem in huge:
        # were anything allocated first this would take minutes or raise MemoryError
        with pytest.raises(TunerError, match=r"problem needs ~\d.* GiB, over --cpu-mem-limit 4.0"):
            CpuTuner().tune(problem, ctx())
    with pytest.raises(TunerError, match=r"over --cpu-mem-limit 0\.00098 GiB"):
        CpuTuner().tune(gemm(m=512, n=512, k=512), ctx(cpu_mem_limit=1 << 20))


@pytest.mark.parametrize("name", [*[n for n in PROBLEMS if "i8" not in n][::3], "gemm-i8"])
def test_memory_estimate_covers_what_numpy_allocates(name: str) -> None:
    problem = PROBLEMS[name]
    context = ctx("full")
    need = make_op(problem).mem_bytes() + harness_bytes(context.topk)
    tracemalloc.start()  # NumPy reports its buffers to tracemalloc
    try:
        CpuTuner(repeats=1).tune(problem, context)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= need


def test_timeout_stops_between_candidates() -> None:
    with pytest.raises(TunerTimeout, match="job timeout"):
        CpuTuner().tune(gemm(m=128, n=128, k=128), ctx("exhaustive", timeout_s=1e-6))


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (lambda: gemm("fp8", out="f32"), "cpu tuner cannot run data type fp8"),
        (lambda: gemm("fp8_bf8", out="f32"), "cpu tuner cannot run data type fp8_bf8"),
        (lambda: gemm("f4E2M1FN", out="f32"), "cpu tuner cannot run data type f4E2M1FN"),
        (lambda: gemm("i8", out="i8"), "cpu tuner cannot run output data type i8"),
        (lambda: conv("convfp8"), "cpu tuner cannot run data type fp8"),
        (lambda: conv("convbf8_fp8"), "cpu tuner cannot run data type bf8_fp8"),
        (lambda: attention("i8"), "cpu tuner cannot run attention with data type i8"),
        # A line is refused when read (problems.attention); a row stored before that check still
        # reaches the tuner, which refuses it too.
        (lambda: dataclasses.replace(attention(), num_heads_q=3, num_heads_kv=2), "not a multiple"),
    ],
)
def test_what_the_cpu_cannot_run_is_a_clear_tuner_error(problem, message: str) -> None:
    with pytest.raises(TunerError, match=message):
        CpuTuner().tune(problem(), ctx())


def test_unknown_op_is_a_tuner_error() -> None:
    class Winograd:
        op = "winograd"

    with pytest.raises(TunerError, match="cpu tuner cannot run op winograd"):
        CpuTuner().tune(Winograd(), ctx())  # type: ignore[arg-type]


def test_perf_configs_give_measurably_different_times() -> None:
    # quick has 32x32x32 tiles (512 NumPy calls) down to one 256x256x256 tile
    outcome = CpuTuner(repeats=5).tune(gemm(m=256, n=256, k=256), ctx("quick"))
    times = [c.kernel_time_ns or 0 for c in outcome.candidates if c.valid]
    assert max(times) > 1.5 * min(times)


def test_data_is_deterministic_from_the_seed() -> None:
    def data(seed: int) -> list[np.ndarray]:
        op = make_op(attention("f16", "-with-attn-bias true"))
        op.setup(np.random.default_rng(seed))
        return [op.q, op.k, op.v, op.bias]

    assert all(np.array_equal(a, b) for a, b in zip(data(3), data(3), strict=True))
    assert not np.array_equal(data(3)[0], data(4)[0])


def test_tensors_live_in_their_layout_order() -> None:
    op = make_op(conv(f="N01GC", i="01NGC", o="NGC01", g=2))
    assert isinstance(op, ConvOp)
    op.setup(np.random.default_rng(0))
    # memory shape in layout order; logical views (N,G,C,H,W) and (G,K,C,Y,X)
    assert op.xin.base.shape == (10, 9, 2, 2, 4)
    assert op.fil.base.shape == (6, 3, 3, 2, 4)
    assert op.yout.base.shape == (2, 2, 6, 10, 9)
    assert op.xin.shape == (2, 2, 4, 10, 9) and op.fil.shape == (2, 6, 4, 3, 3)
    g = make_op(gemm(ta=True, tb=True, to=True, m=5, n=6, k=7))
    g.setup(np.random.default_rng(0))
    assert g.a.base.shape == (1, 7, 5) and g.b.base.shape == (1, 6, 7)
    assert g.c.base.shape == (1, 6, 5)


def _naive_conv(x, w, stride, pad, dil):
    """Seven nested loops over logical (N,G,C,H,W) input and (G,K,C,Y,X) filter."""
    n_, g_, c_, h_, w_ = x.shape
    _, k_, _, y_, x_ = w.shape
    ho = (h_ + 2 * pad[0] - dil[0] * (y_ - 1) - 1) // stride[0] + 1
    wo = (w_ + 2 * pad[1] - dil[1] * (x_ - 1) - 1) // stride[1] + 1
    out = np.zeros((n_, g_, k_, ho, wo))
    for n, g, k, oh, ow in itertools.product(*map(range, out.shape)):
        total = 0.0
        for c, fy, fx in itertools.product(range(c_), range(y_), range(x_)):
            ih, iw = oh * stride[0] - pad[0] + fy * dil[0], ow * stride[1] - pad[1] + fx * dil[1]
            if 0 <= ih < h_ and 0 <= iw < w_:
                total += float(x[n, g, c, ih, iw]) * float(w[g, k, c, fy, fx])
        out[n, g, k, oh, ow] = total
    return out


@pytest.mark.parametrize("d", [1, 2, 4])
def test_conv_references_match_the_definition(d: int) -> None:
    """fwd against nested loops; bwd and wrw by the adjoint identity <fwd(x,w), dy> = ..."""
    problem = conv(d=d, f="GNC01", i="NHWC", n=2, c=4, h=6, w=5, k=6, y=3, x=2, p=1, q=0, u=2,
                   v=1, dh=1, dw=2, g=2)  # fmt: skip
    op = make_op(problem)
    assert isinstance(op, ConvOp)
    op.setup(np.random.default_rng(1))
    (ref,) = op._refs
    # The direction's output buffer is not written before the op runs (np.empty: its bytes may
    # be a signalling NaN, which a cast reports): only its shape is read.
    x, w, dy = (
        np.zeros(a.shape) if any(a is out for out in op.outputs) else a.astype(np.float64)
        for a in (op.xin, op.fil, op.yout)
    )
    args = ((op.sh, op.sw), (op.ph, op.pw), (op.dh, op.dw))
    if d == 1:
        np.testing.assert_allclose(ref, _naive_conv(x, w, *args), rtol=1e-12, atol=1e-12)
    elif d == 2:  # <fwd(e_i, w), dy> = dx_i for every input element i
        for idx in itertools.islice(np.ndindex(x.shape), 0, None, 7):
            e = np.zeros_like(x)
            e[idx] = 1
            assert ref[idx] == pytest.approx(float((_naive_conv(e, w, *args) * dy).sum()))
    else:  # <fwd(x, e_i), dy> = dw_i for every filter element i
        for idx in itertools.islice(np.ndindex(w.shape), 0, None, 5):
            e = np.zeros_like(w)
            e[idx] = 1
            assert ref[idx] == pytest.approx(float((_naive_conv(x, e, *args) * dy).sum()))


def test_attention_reference_matches_the_definition() -> None:
    problem = attention("f32", "-causal true -return_lse true -with-attn-scale true", g=1,
                        sq=5, sk=7, dqk=3, dv=2)  # fmt: skip
    op = make_op(problem)
    op.setup(np.random.default_rng(2))
    o_ref, lse_ref = op._refs
    q, k, v, scale = (a.astype(np.float64)[0] for a in (op.q, op.k, op.v, op.scale))
    for i in range(5):
        logits = [float(q[i] @ k[j]) * scale[i, j] for j in range(i + 1)]  # keys j <= i
        lse = np.log(sum(np.exp(s) for s in logits))
        assert lse_ref[0, i] == pytest.approx(lse)
        want = sum(np.exp(s - lse) * v[j] for j, s in enumerate(logits))
        np.testing.assert_allclose(o_ref[0, i], want, rtol=1e-12)


def test_int8_is_exact() -> None:
    op = make_op(gemm("i8", m=33, n=21, k=300))
    op.setup(np.random.default_rng(0))
    op.run_blocked((16, 16, 64))
    assert op.outputs[0].dtype == np.int32
    assert np.array_equal(op.outputs[0], op._refs[0])
