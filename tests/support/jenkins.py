"""examples/Jenkinsfile run as Jenkins runs it, without Jenkins: its STEP_* shell strings, and
the steps of the declarative pipeline that move files between nodes (stash, unstash, deleteDir
in a dir), in the pipeline's order; each innermost stage an agent of its own (a workspace and a
host name of its own), the branches of a `parallel` at once; catchError as Jenkins treats it
(the rest of its block skipped, the build UNSTABLE, the pipeline going on), any other failure
failing the build and skipping the stages after it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

JENKINSFILE = Path(__file__).resolve().parent.parent.parent / "examples" / "Jenkinsfile"


@dataclass(frozen=True)
class Action:
    stage: str  # the innermost stage: one agent, one workspace
    kind: str  # sh, stash, unstash, deleteDir
    arg: str  # the STEP_ name (sh), the stash's name, the directory deleted
    keep_stdout_in: str | None = None  # env.NAME = sh(returnStdout: true, …)
    caught: tuple[int, ...] = ()  # the catchError blocks around it, outermost first
    includes: tuple[str, ...] = ()  # stash: its patterns
    excludes: tuple[str, ...] = ()  # stash: what it leaves out (`dir/**/*.o`)


@dataclass
class Phase:
    """A stage of the pipeline's top level: one branch, or the branches of a `parallel`."""

    branches: dict[str, list[Action]] = field(default_factory=dict)


_ACTION_RE = re.compile(
    r"(?:env\.(?P<keep>\w+) = )?sh\([^)]*?script: (?P<step1>STEP_\w+)\)"
    r"|sh label: '[^']*', script: (?P<step2>STEP_\w+)"
    r"|stash name: '(?P<stash>[^']+)', includes: '(?P<includes>[^']*)',\s*"
    r"excludes: '(?P<excludes>[^']*)'"
    r"|unstash '(?P<unstash>[^']+)'"
    r"|dir\('(?P<dir>[^']+)'\) \{ deleteDir\(\) \}"
)


def steps(text: str) -> dict[str, str]:
    """The STEP_* scripts, in the order they are written."""
    return dict(re.findall(r"^def (STEP_\w+) = '''\n(.*?)'''$", text, re.M | re.S))


def phases(text: str) -> list[Phase]:
    """The pipeline's actions, by top-level stage and parallel branch, in order: braces are
    followed frame by frame (stage, parallel, catchError, anything else)."""
    body = text[text.index("\npipeline {") :]
    frames: list[tuple[str, str | int]] = []  # ("stage", name) | ("parallel", id) | ("catch", id)
    out: list[Phase] = []
    where: dict[object, Phase] = {}
    events = sorted(
        [(m.start(), "action", m) for m in _ACTION_RE.finditer(body)]
        + [(i, c, None) for i, c in enumerate(body) if c in "{}"],
        key=lambda e: e[0],
    )
    skip_until = -1
    for pos, what, match in events:
        if pos < skip_until:
            continue  # a brace inside an action's own text (dir('x') { deleteDir() })
        if what == "{":
            frames.append(_frame(body[:pos], pos))
        elif what == "}":
            frames.pop()
        else:
            assert match is not None
            skip_until = match.end()
            _add(out, where, frames, match)
    return out


def _frame(before: str, pos: int) -> tuple[str, str | int]:
    line = before[before.rfind("\n") + 1 :]
    if m := re.search(r"stage\('([^']+)'\)\s*$", line):
        return ("stage", m.group(1))
    if re.search(r"parallel\s*$", line):
        return ("parallel", pos)
    if re.search(r"catchError\([^)]*\)\s*$", line):
        return ("catch", pos)
    return ("other", pos)


def _add(out: list[Phase], where: dict[object, Phase], frames, match: re.Match[str]) -> None:
    stages = [name for kind, name in frames if kind == "stage"]
    parallel = next((f for f in frames if f[0] == "parallel"), None)
    top = parallel or ("stage", stages[0])
    if top not in where:
        where[top] = Phase()
        out.append(where[top])
    stage = str(stages[-1])
    caught = tuple(int(p) for kind, p in frames if kind == "catch")
    if match.group("stash"):
        patterns = tuple(p.strip() for p in match.group("includes").split(","))
        left_out = tuple(p.strip().rpartition("/")[2] for p in match.group("excludes").split(","))
        action = Action(stage, "stash", match.group("stash"), caught=caught, includes=patterns,
                        excludes=left_out)  # fmt: skip
    elif match.group("unstash"):
        action = Action(stage, "unstash", match.group("unstash"), caught=caught)
    elif match.group("dir"):
        action = Action(stage, "deleteDir", match.group("dir"), caught=caught)
    else:
        step = match.group("step1") or match.group("step2")
        action = Action(stage, "sh", step, match.group("keep"), caught)
    where[top].branches.setdefault(stage, []).append(action)


@dataclass
class Ran:
    """What one run of the pipeline did."""

    result: str = "SUCCESS"  # SUCCESS, UNSTABLE or FAILURE, as Jenkins sets the build's
    steps: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    failed_stages: set[str] = field(default_factory=set)
    skipped_stages: set[str] = field(default_factory=set)


def slug(stage: str) -> str:
    return re.sub(r"\W+", "-", stage)


def hostname_of(stage: str) -> str:
    return slug(stage).lower()


Hook = Callable[[str, str, subprocess.Popen[str]], None]


@dataclass
class Agents:
    """Each stage's node: its environment (added to the pipeline's) and a hook called as each
    step starts, with the process (started in a process group of its own: a lost agent takes
    the whole group with it)."""

    env: Callable[[str], dict[str, str]] = lambda stage: {}
    started: Hook = lambda stage, step, proc: None
    before: Callable[[str], None] = lambda stage: None  # called as a stage's agent starts


def run(root: Path, env: dict[str, str], agents: Agents | None = None) -> Ran:
    """Every stage of the pipeline in `root` (a workspace per stage), Jenkins' way."""
    text = JENKINSFILE.read_text()
    scripts, agents = steps(text), agents or Agents()
    env, ran, stashes = dict(env), Ran(), root / ".stashes"
    lock = threading.Lock()
    for phase in phases(text):
        if ran.result == "FAILURE":
            ran.skipped_stages |= set(phase.branches)
            continue
        threads = [
            threading.Thread(
                target=_branch,
                args=(root, stage, actions, scripts, env, agents, ran, stashes, lock),
            )
            for stage, actions in phase.branches.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return ran


def _branch(root, stage, actions, scripts, env, agents, ran, stashes, lock) -> None:
    workspace = root / slug(stage)
    workspace.mkdir(parents=True, exist_ok=True)
    agents.before(stage)
    failed_in: set[int] = set()
    for action in actions:
        if failed_in & set(action.caught):
            continue  # catchError: the rest of its block is skipped
        ok = _do(action, workspace, scripts, env, agents, ran, stashes, lock)
        if ok:
            continue
        with lock:
            ran.failed_stages.add(stage)
            if action.caught:
                ran.result = "FAILURE" if ran.result == "FAILURE" else "UNSTABLE"
                failed_in.add(action.caught[-1])
            else:
                ran.result = "FAILURE"
                return


def _do(action, workspace, scripts, env, agents, ran, stashes, lock) -> bool:
    if action.kind == "stash":
        _copy_in(workspace, stashes / action.arg, action.includes, action.excludes)
        return True
    if action.kind == "unstash":
        _copy_in(stashes / action.arg, workspace, ("**",))
        return True
    if action.kind == "deleteDir":
        target = workspace / action.arg
        if target.is_symlink():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        return True
    with lock:
        step_env = env | agents.env(action.stage) | {"WORKSPACE": str(workspace)}
    host = hostname_of(action.stage)
    # Each agent a host of its own: a UTS namespace named after the stage.
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    argv = ["unshare", *userns, "--uts", "sh", "-c", 'hostname "$1" && exec bash -c "$2"', "sh",
            host, scripts[action.arg]]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=workspace, env=step_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    agents.started(action.stage, action.arg, proc)
    out, err = proc.communicate(timeout=600)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    with lock:
        ran.steps[f"{action.arg}@{action.stage}"] = done
        if action.keep_stdout_in and done.returncode == 0:
            env[action.keep_stdout_in] = out.strip()
    return done.returncode == 0


def _copy_in(
    src: Path, dest: Path, patterns: tuple[str, ...], left_out: tuple[str, ...] = ()
) -> None:
    """Files of `src` matching `patterns` (a `dir/**`, a file, or `**`) but none of `left_out`
    (file name patterns) copied into `dest` with their modes, links kept as links, as stash and
    unstash carry them."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(*left_out)
    for pattern in patterns:
        name = pattern.removesuffix("**").rstrip("/")
        path = src / name if name else src
        if path.is_dir() and not path.is_symlink():
            target = dest / name if name else dest
            shutil.copytree(path, target, symlinks=True, ignore=ignore, dirs_exist_ok=True)
        elif path.exists() or path.is_symlink():
            shutil.copy2(path, dest / name, follow_symlinks=False)
