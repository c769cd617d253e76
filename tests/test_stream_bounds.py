"""What a benchmark stream's tool writes stays within bounds (issue 34 M6-M10 and the minors):
each reply field checked, lines and logs read with a cap, a row for another problem and an
output replaced by a link refused. Each hostile reply fails its request with one clear line
(the worker settles that as the job's failure, test_stream.py), the reply thread survives it,
and the reading process stays under 200 MB of RSS (VmHWM from /proc) whatever the tool writes.

The tool here is a hostile stand-in speaking the stream's protocol (docs/formats.md); each
case runs the real Stream in a process of its own, so that its peak RSS is the stream's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.clitools import subprocess_env
from support.rocmlir import ARCH_FULL
from support.twostage import gemm

from mlirtuna.problems import parse
from mlirtuna.tuners.rocmlir.debugfile import parse_stats

MAX_RSS_KB = 200 << 10
CONFIG = gemm(64)
OTHER = gemm(128)
SECRET = "SECRET-LINE-of-another-file"

# Answers request 1 as HOSTILE says, request 2 (if any) with a plain failure "second".
TOOL = textwrap.dedent(
    r"""
    import json, os, sys, time
    mode = os.environ["HOSTILE"]
    big = b"x" * (1 << 20)
    def out(data):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    def row(output, config, tflops):
        with open(output, "w") as f:
            f.write("# arch\tnumCUs\tnumChiplets\ttestVector\tperfConfig\tTFlops\ttuningSpace"
                    "\tcommitId\ttimestamp\tdurationSec\n")
            f.write(f"ARCH\t304\t8\t{config}\tv2:16,16,4,16,16,4,1,1,1\t{tflops}\tquick"
                    "\tabc\t2026-01-01T00:00:00Z\t1.0\n")
    for n, line in enumerate(sys.stdin):
        req = json.loads(line)
        rid, output = req["id"], req["output"]
        if n > 0:
            out(json.dumps({"id": rid, "status": 1, "error": "second"}).encode() + b"\n")
            continue
        if mode.startswith("status:"):
            out(b'{"id": "%s", "status": %s, "error": "x"}\n' % (rid.encode(), mode[7:].encode()))
        elif mode == "deep":
            out(b"[" * 100000 + b"]" * 100000 + b"\n")
        elif mode == "utf8":
            out(b'{"id": "%s", "status": 1, "error": "bad \xff byte"}\n' % rid.encode())
        elif mode == "long_line":
            for _ in range(64):
                out(big)
            out(b"\n")
        elif mode == "no_newline":
            for _ in range(64):
                out(big)
            sys.stdin.read()  # holds the line open until the stream is closed
            break
        elif mode == "big_log":
            with open(output + ".log", "wb") as f:
                for _ in range(64):
                    f.write(big)
                f.write(b"\nERROR: the last line of a huge log\n")
            out(json.dumps({"id": rid, "status": 1, "error": ""}).encode() + b"\n")
        elif mode in ("tflops", "other", "plain"):
            tflops = "1e308" if mode == "tflops" else "10.5"
            row(output, os.environ["OTHER" if mode == "other" else "CONFIG"], tflops)
            out(json.dumps({"id": rid, "status": 0, "error": ""}).encode() + b"\n")
        elif mode == "symlink":
            os.symlink(os.environ["SECRET_FILE"], output)
            out(json.dumps({"id": rid, "status": 0, "error": ""}).encode() + b"\n")
    """
).replace("ARCH", ARCH_FULL)

# Runs the real Stream over the tool; prints each request's first line and the peak RSS.
DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from mlirtuna.problems import parse
    from mlirtuna.tuners.base import TuneContext
    from mlirtuna.tuners.rocmlir.stream import Stream
    tool, work, wanted = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    ctx = TuneContext("gfx942", os.environ["ARCH_FULL"], 304, 8, "quick", timeout_s=60)
    stream = Stream([sys.executable, tool], work, dict(os.environ), ctx, False, 1.0)
    problem = parse("gemm", os.environ["CONFIG"])
    for key in ("job-1", "job-2"):
        stream.feed(key, problem, work)
    got, deadline = {}, time.monotonic() + 60
    while len(got) < wanted and time.monotonic() < deadline:
        item = stream.reply(0.5)
        if item is not None:
            key, result = item
            if isinstance(result, Exception):
                got[key] = "error: " + str(result) + "\\n" + (result.detail or "")
            else:
                got[key] = f"winner: {result.winner.perf_config} {result.winner.tflops}"
    stream.close()
    status = Path("/proc/self/status").read_text()
    hwm = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1])
    print(json.dumps({"got": got, "hwm_kb": hwm}))
    """
)


def run_stream(tmp_path: Path, mode: str, wanted: int = 2) -> dict[str, str]:
    tool = tmp_path / "hostile_tool.py"
    tool.write_text(TOOL)
    secret = tmp_path / "secret.tsv"
    secret.write_text(f"{SECRET}\tnot a tuning db\n")
    env = {**subprocess_env(""), "HOSTILE": mode, "CONFIG": CONFIG, "OTHER": OTHER,
           "ARCH_FULL": ARCH_FULL, "SECRET_FILE": str(secret)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tool), str(tmp_path), str(wanted)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["hwm_kb"] < MAX_RSS_KB, f"peak RSS {report['hwm_kb'] >> 10} MB ({mode})"
    assert len(report["got"]) == wanted, report["got"]
    return report["got"]


def first_line(text: str) -> str:
    return text.splitlines()[0]


@pytest.mark.parametrize("status", ['"zero"', "NaN", "1e999", "[0]", "true", "-1", "300"])
def test_a_reply_whose_status_is_not_an_exit_status_fails_its_request(tmp_path, status):
    got = run_stream(tmp_path, f"status:{status}")
    assert "reply is malformed: status" in first_line(got["job-1"])
    assert "is not an exit status" in first_line(got["job-1"])
    assert "second" in got["job-2"]  # the reply thread went on


def test_a_reply_nested_100000_deep_fails_its_request_and_the_thread_goes_on(tmp_path):
    got = run_stream(tmp_path, "deep")
    assert "reply is malformed: not JSON" in first_line(got["job-1"])
    assert "second" in got["job-2"]


def test_invalid_utf8_in_a_reply_is_reported_with_the_tools_status(tmp_path):
    got = run_stream(tmp_path, "utf8")
    assert "bad \ufffd byte" in got["job-1"]  # not dropped: no wait for the job timeout
    assert "second" in got["job-2"]


def test_a_64_mib_reply_line_is_refused_within_the_memory_bound(tmp_path):
    got = run_stream(tmp_path, "long_line")
    assert f"longer than {1 << 20} bytes" in first_line(got["job-1"])
    assert "second" in got["job-2"]


def test_a_64_mib_reply_without_an_end_fails_its_request_before_it_ends(tmp_path):
    got = run_stream(tmp_path, "no_newline", wanted=1)
    assert f"longer than {1 << 20} bytes" in first_line(got["job-1"])


def test_a_64_mib_log_is_read_from_its_tail(tmp_path):
    got = run_stream(tmp_path, "big_log")
    assert "the last line of a huge log" in got["job-1"]
    assert len(got["job-1"]) < 200 << 10


def test_a_plain_reply_is_recorded(tmp_path):
    # The control for the next two: the same files with sane numbers are an outcome.
    got = run_stream(tmp_path, "plain")
    assert got["job-1"].startswith("winner: v2:16,16,4,16,16,4,1,1,1")


def test_tflops_1e308_fails_its_request(tmp_path):
    got = run_stream(tmp_path, "tflops")
    assert "1e+308 TFlops" in first_line(got["job-1"]) and "past any GPU" in got["job-1"]


def test_a_row_for_another_problem_is_refused(tmp_path):
    got = run_stream(tmp_path, "other")
    assert "a row for another problem" in first_line(got["job-1"])
    assert parse("gemm", OTHER).canonical() != parse("gemm", CONFIG).canonical()


def test_an_output_replaced_by_a_link_is_not_followed(tmp_path):
    got = run_stream(tmp_path, "symlink")
    assert "tuning.tsv is a link: not read" in first_line(got["job-1"])
    assert SECRET not in got["job-1"]
    assert os.path.exists(tmp_path / "secret.tsv")


def test_a_sample_count_past_an_integer_column_is_dropped():
    # .debug Stats with "count": 10**20 would make the candidate's INSERT fail on the servers
    # (an INTEGER column): the statistics keep their median, the count is unknown.
    spread = parse_stats(json.dumps({"median": 5.0, "min": 4.0, "stddev": 0.1, "count": 10**20}))
    assert spread is not None and spread.median == 5e6 and spread.samples is None  # ms -> ns
