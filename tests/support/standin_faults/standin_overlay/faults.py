"""Faults injected into the package's stand-in, wrapped around its seams (the functions of
bin/standin_runner/ that the tests' faults need), each switched on by the environment:

  FAKE_TUNINGRUNNER_FAULT: fail | hang | none | garbage | wrong_arch | empty | crash_partial
    | usage (E3: argparse's usage error, exit 2) (E2/E3), fail (E2.5: a "### " line),
    fail | gpu_timeout (E4: driver exit 3, gpu_timed_out; fail also in --compile-only),
    stream_exit | stream_crash | stream_hang | stream_skip | stream_bad_reply (E4's
    --benchmark-stream: it cannot start; it dies, hangs, never answers or answers with status
    "zero" at a request);
  FAKE_TUNINGRUNNER_FAULT_CONFIG=TEXT: the fault hits only configs containing TEXT (E3, E4);
  FAKE_TUNINGRUNNER_DELAY: seconds to sleep per config (E3: a --timeout shorter than it times
    the config out);
  FAKE_TUNINGRUNNER_SETSID_CHILD=1: "hang"'s child leaves the group and ignores SIGTERM (a
    daemon the driver left behind); FAKE_TUNINGRUNNER_TOOL_PIDFILE, _CHILD_PIDFILE: where
    "hang" writes its own pid and its child's; FAKE_TUNINGRUNNER_IGNORE_SIGTERM=1: "hang"
    ignores SIGTERM (so only SIGKILL stops it);
  FAKE_TUNINGRUNNER_STREAM_FOREIGN=N: after its first reply, the stream prints N reply lines
    naming requests nobody made (a stdout that something else writes to as well);
  FAKE_TUNINGRUNNER_COMMIT, FAKE_TUNINGRUNNER_TWO_STAGE: see __init__.py."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

from standin_runner import candidates, common, e3, e4_bundles, e4_stream, e4_tuning

FAULT = os.environ.get("FAKE_TUNINGRUNNER_FAULT", "")
E2_HEADER = "# arch\tnumCUs\ttestVector\tperfConfig\tTFlops (exhaustive)\n"
ERA = "E3"  # the era this invocation runs (install)


def install(era: str) -> None:
    global ERA
    ERA = era
    if FAULT == "wrong_arch":
        common.Gpu = WrongArchGpu
    if os.environ.get("FAKE_TUNINGRUNNER_COMMIT"):
        common.commit_id = lambda: os.environ["FAKE_TUNINGRUNNER_COMMIT"]
    if FAULT == "none":
        candidates.tune = _none_measured(candidates.tune)
    if os.environ.get("FAKE_TUNINGRUNNER_TWO_STAGE"):
        e3.parser = _with_two_stage_topk(e3.parser)
        e3.measure = _two_stage(e3.measure)
    e3.parse = _usage_fault(e3.parse)
    e3.tune_one = _e3_faults(e3.tune_one)
    e4_tuning.measure_one = _e4_faults(e4_tuning.measure_one)
    e4_bundles.compile_problem = _compile_faults(e4_bundles.compile_problem)
    e4_stream.ready = _stream_exit(e4_stream.ready)
    e4_stream.answer = _stream_faults(e4_stream.answer)


class WrongArchGpu(common.Gpu):
    """A gfx90a with 110 CUs, whatever the build was set to."""

    def __init__(self) -> None:
        super().__init__()
        self.arch, self.num_cu, self.num_chiplets = "gfx90a:sramecc+:xnack-", 110, 1
        self.chip = "gfx90a"


class Everything(frozenset):
    """Every perf config: none of them runs (the fault "none")."""

    def __contains__(self, item: object) -> bool:
        return True


def _none_measured(tune):
    @functools.wraps(tune)
    def wrapper(op, config, space, gpu, era, debug, not_compiled=frozenset()):
        return tune(op, config, space, gpu, era, debug, Everything())

    return wrapper


def fault_for(config: str) -> str:
    """FAKE_TUNINGRUNNER_FAULT, for the configs containing FAKE_TUNINGRUNNER_FAULT_CONFIG only
    when that is set (one bad config among several of one call)."""
    only = os.environ.get("FAKE_TUNINGRUNNER_FAULT_CONFIG")
    # E4 keys spell `-transO false`; the TEXT may be given without it
    plain = config.replace(" -transO false", "")
    return FAULT if not only or only in config or only in plain else ""


def delay_s() -> float:
    return float(os.environ.get("FAKE_TUNINGRUNNER_DELAY", "0") or 0)


def maybe_delay() -> None:
    if delay_s() > 0:
        time.sleep(delay_s())


def hang() -> None:
    """Sleep forever, with a child in the same process group (as the real driver pipeline is)."""
    escape = os.environ.get("FAKE_TUNINGRUNNER_SETSID_CHILD") == "1"
    code = "import signal, time\n" + (
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if escape else ""
    )
    child = subprocess.Popen([sys.executable, "-c", code + "while True: time.sleep(60)"],
                             start_new_session=escape)  # fmt: skip
    if os.environ.get("FAKE_TUNINGRUNNER_TOOL_PIDFILE"):
        with open(os.environ["FAKE_TUNINGRUNNER_TOOL_PIDFILE"], "w") as f:
            f.write(f"{os.getpid()}\n")
    pidfile = os.environ.get("FAKE_TUNINGRUNNER_CHILD_PIDFILE")
    if pidfile:
        with open(pidfile, "w") as f:
            f.write(f"{child.pid}\n")
    if os.environ.get("FAKE_TUNINGRUNNER_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(60)


def write_garbage(out) -> None:
    """A file whose second line has a non-numeric numCUs and too few fields."""
    out.write(common.V3_HEADER + "\n" if ERA == "E3" else E2_HEADER)
    out.write("gfx942:sramecc+:xnack-\tthree hundred\t-t f16\n")


def crash_partial(out) -> None:
    out.write(common.V3_HEADER + "\n" if ERA == "E3" else E2_HEADER)
    out.write("gfx942:sramecc+:xnack-\t30")
    out.flush()
    sys.stderr.write("Segmentation fault (core dumped)\n")
    sys.stderr.flush()
    os._exit(139)


# -- E3 ------------------------------------------------------------------------------------------


def _usage_fault(parse):
    @functools.wraps(parse)
    def wrapper(argv):
        parser, args = parse(argv)
        if FAULT == "usage":  # a command line the tool refuses: argparse's error, exit 2
            parser.error("argument --op: refused (FAKE_TUNINGRUNNER_FAULT=usage)")
        return parser, args

    return wrapper


def _with_two_stage_topk(parser):
    @functools.wraps(parser)
    def wrapper(available_gpus, *args, **kwargs):
        p = parser(available_gpus, *args, **kwargs)
        e4 = args[4] if len(args) > 4 else kwargs.get("e4", False)
        if not e4:  # E4 has its own
            p.add_argument("--two-stage-topk", type=int, default=None, metavar="K",
                           help="E4: re-measure top K")  # fmt: skip
        return p

    return wrapper


def _two_stage(measure):
    """E3 with E4's --two-stage-topk K: the K fastest of the first pass measured again,
    "precisely"; the others' .debug TFlops empty, as Discarded."""

    @functools.wraps(measure)
    def wrapper(args, gpu, gpu_id, config):
        result = measure(args, gpu, gpu_id, config)
        if getattr(args, "two_stage_topk", None):
            candidates.two_stage(result, config, args.two_stage_topk)
        return result

    return wrapper


def _e3_faults(tune_one):
    @functools.wraps(tune_one)
    def wrapper(args, gpu, gpu_id, config, log, out):
        if args.timeout is not None and delay_s() > args.timeout:
            time.sleep(args.timeout)
            log.error(
                f"[GPU {gpu_id}] Tuning timed out after {args.timeout}s\nReproduce: "
                f"ROCR_VISIBLE_DEVICES={gpu_id} rocmlir-gen ... | rocmlir-tuning-driver ..."
            )
            return "timed_out"
        maybe_delay()
        fault = fault_for(config)
        if fault == "hang":
            hang()
        if fault == "fail":
            pipeline = (f"rocmlir-gen {config} | rocmlir-tuning-driver "
                        f"--tuning-space={args.tuning_space}")  # fmt: skip
            log.error(
                f"[GPU {gpu_id}] Tuning pipeline failed\nExit code: 1\nReproduce: "
                f"ROCR_VISIBLE_DEVICES={gpu_id} {pipeline}\nSTDERR:\nCompilation failed"
            )
            return "failed"
        result = tune_one(args, gpu, gpu_id, config, log, out)
        if isinstance(result, str):
            return result
        if fault == "empty":
            sys.exit(0)  # forced: the real E3 exits 1 here; the E2 quirk, for both eras
        if fault == "garbage":
            write_garbage(out)
            sys.exit(0)
        if fault == "crash_partial":
            crash_partial(out)
        return result

    return wrapper


# -- E4 ------------------------------------------------------------------------------------------


def _e4_faults(measure_one):
    @functools.wraps(measure_one)
    def wrapper(measure, config, gpu_id, log):
        maybe_delay()
        fault = fault_for(config)
        if fault in ("gpu_timeout", "fail"):
            timed_out = fault == "gpu_timeout"
            code = e4_tuning.GPU_TIMEOUT_EXIT_CODE if timed_out else 1
            log.error(
                f"[GPU {gpu_id}] Tuning pipeline failed\nExit code: {code}\n"
                + ("GPU run timed out" if timed_out else "Compilation failed")
            )
            return "gpu_timed_out" if timed_out else "failed"
        return measure_one(measure, config, gpu_id, log)

    return wrapper


def _compile_faults(compile_problem):
    @functools.wraps(compile_problem)
    def wrapper(args, config, target, directory):
        maybe_delay()
        if fault_for(config) == "fail":
            return False
        return compile_problem(args, config, target, directory)

    return wrapper


def _stream_exit(ready):
    @functools.wraps(ready)
    def wrapper(gpu_id, log):
        if FAULT == "stream_exit":
            log.error(f"GPU {gpu_id}: cannot start the benchmark stream (FAKE_TUNINGRUNNER_FAULT)")
            return False
        return ready(gpu_id, log)

    return wrapper


def _stream_faults(answer):
    foreign = [int(os.environ.get("FAKE_TUNINGRUNNER_STREAM_FOREIGN", "0"))]  # after the first

    @functools.wraps(answer)
    def wrapper(args, gpu, gpu_id, rid, op, config, artifacts, output):
        fault = fault_for(config)
        if fault == "stream_crash":
            os._exit(134)
        if fault == "stream_hang":  # a GPU run that never returns
            while True:
                time.sleep(60)
        if fault == "stream_skip":  # read, never answered (a lost request)
            return
        if fault == "stream_bad_reply":  # a reply no exit status is (issue 34 M6)
            print(json.dumps({"id": rid, "status": "zero", "error": ""}), flush=True)
            return
        answer(args, gpu, gpu_id, rid, op, config, artifacts, output)
        if foreign[0]:
            lines = (json.dumps({"id": f"job-{n}-foreign", "status": 0, "error": ""}) + "\n"
                     for n in range(foreign[0]))  # fmt: skip
            sys.stdout.writelines(lines)
            sys.stdout.flush()
            foreign[0] = 0

    return wrapper
