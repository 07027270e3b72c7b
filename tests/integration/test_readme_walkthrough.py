"""The README's walkthrough ("Using it", "From a clone to a query"), run as a user runs it.

A user copies the walkthrough's commands top to bottom from the root of a fresh clone. This
test extracts the same commands from README.md and runs them the same way, so the README
cannot drift from what works: each code block of the walkthrough is preceded by a marker,

    <!-- walkthrough: terminal, ready at "serving on" -->   a long-running command a user starts in
                                                           another terminal and waits for that line
    <!-- walkthrough: run -->                                each line a command that must exit 0
    <!-- walkthrough: run until 'READY' -->                  re-run until its output says READY
    <!-- walkthrough: file produce.py -->                    the block saved as that file
    <!-- walkthrough: output -->                             what the command before prints

and every other block of the walkthrough must be the install line (the suite runs in the
installed checkout). The commands run in a fresh directory whose entries link to the
checkout's, so `conf/...`, `./spark-submit.sh` and `./danube-data/...` mean what they mean to a
user and nothing is written into the checkout. The only change from the README: its fixed
ports (etcd 2379, the broker 6650, ...) are swapped for free ones, in the commands and through
the configuration files' environment overrides, so the test never meets another etcd or
broker on this machine; the configuration files are checked to listen where the README says.
Terminals are stopped as a user stops them, Ctrl-C (SIGINT to their process group), in reverse.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from danube_core.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
SECTION = "### From a clone to a query, step by step"
MARKER = re.compile(r"<!-- walkthrough: (?P<spec>[^>]*?) -->\n```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$",
                    re.S | re.M)
FENCE = re.compile(r"^```[\w-]*\n(?P<body>.*?)^```$", re.S | re.M)
# The README's fixed ports, each with the free port the test uses instead.
README_PORTS = {2379: "etcd", 2380: "etcd peers", 6650: "broker", 50051: "broker admin",
                7701: "speed layer master", 7800: "data gateway"}
# Checkout entries a user's fresh clone does not have (or that runs write): not linked.
NOT_LINKED = {".git", "build", "danube-data", "spark-warehouse", "metastore_db", "derby.log",
              ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"}
# What the walkthrough writes in a user's checkout: it must land in the test's directory instead.
USER_FILES = ("danube-data", "produce.py", "spark-warehouse", "speedlayer-audit-m1.jsonl")
TERMINAL_READY_S = 120.0
UNTIL_DEADLINE_S = 120.0
COMMAND_TIMEOUT_S = 600.0
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Step:
    """One marked block of the walkthrough, in README order."""

    kind: str          # terminal | run | file | output
    body: str          # the block's text
    argument: str = ""  # ready/until text, or the file name

    def commands(self) -> list[str]:
        """The block's shell commands: comments and blank lines dropped, `\\` lines joined."""
        joined = re.sub(r"\\\n\s*", " ", self.body)
        return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def walkthrough_section(text: str) -> str:
    """The walkthrough subsection of the README: from its heading to the next heading of its level."""
    start = text.find(SECTION)
    assert start >= 0, f"README.md has no {SECTION!r} heading: the walkthrough is gone"
    end = text.find("\n### ", start + len(SECTION))
    end_section = text.find("\n## ", start)
    ends = [e for e in (end, end_section) if e >= 0]
    return text[start:min(ends)] if ends else text[start:]


def parse_spec(spec: str, body: str) -> Step:
    """A marker's spec (`terminal, ready at "x"`, `run until "x"`, `file f`, `run`, `output`)."""
    quoted = re.search(r'"(?P<double>[^"]+)"|\'(?P<single>[^\']+)\'', spec)
    text = quoted and (quoted.group("double") or quoted.group("single"))
    words = spec.split()
    kind = words[0].rstrip(",") if words else ""
    if kind == "terminal":
        assert text and "ready at" in spec, f"walkthrough marker {spec!r}: a terminal needs `ready at \"<log text>\"`"
        return Step("terminal", body, text)
    if kind == "run":
        if "until" in spec:
            assert text, f"walkthrough marker {spec!r}: `until` needs a quoted text"
            return Step("run", body, text)
        return Step("run", body)
    if kind == "file" and len(words) == 2:
        return Step("file", body, words[1])
    if kind == "output" and len(words) == 1:
        return Step("output", body)
    raise AssertionError(f"walkthrough marker {spec!r} is not one of: terminal, ready at \"...\" | run | "
                         f"run until \"...\" | file NAME | output")


def extract_steps(text: str) -> list[Step]:
    """The walkthrough's steps from the README's text; fails on unmarked or malformed blocks."""
    section = walkthrough_section(text)
    steps = [parse_spec(m.group("spec"), m.group("body")) for m in MARKER.finditer(section)]
    marked = {m.start("body") for m in MARKER.finditer(section)}
    for fence in FENCE.finditer(section):
        if fence.start("body") not in marked:
            assert "pip install" in fence.group("body"), (
                f"a code block of the walkthrough has no <!-- walkthrough: ... --> marker, so no test "
                f"runs it:\n{fence.group(0)}")
    kinds = [s.kind for s in steps]
    for kind in ("terminal", "run", "file", "output"):
        assert kind in kinds, f"the walkthrough has no `{kind}` block: its markers are missing or renamed"
    for before, step in zip(steps, steps[1:]):
        if step.kind == "output":
            assert before.kind == "run", "an `output` block must follow the `run` block whose last command prints it"
    return steps


def test_readme_walkthrough_is_marked_for_this_test():
    """The README keeps a complete, marked walkthrough (fast: parsing only)."""
    steps = extract_steps(README.read_text())
    commands = " ".join(cmd for s in steps if s.kind in ("run", "terminal") for cmd in s.commands())
    for needed in ("etcd", "python -m broker ", "topics create", "broker.tools dump", "./spark-submit.sh run",
                   "speedlayer master", "speedlayer worker", "speedlayer gateway", "--replication",
                   "speedlayer query"):
        assert needed in commands, f"the walkthrough no longer runs {needed!r}"


def test_readme_install_line_is_the_one_demo_sh_runs():
    """The install is the walkthrough's one block this test cannot run (the suite runs in the
    installed checkout); `./demo.sh` runs it, so the README must ask for what demo.sh installs."""
    section = walkthrough_section(README.read_text())
    (install,) = [line for fence in FENCE.finditer(section) for line in fence.group("body").splitlines()
                  if "pip install" in line]
    demo = next(line for line in (REPO_ROOT / "demo.sh").read_text().splitlines() if "pip install" in line)
    demo_words = shlex.split(demo)
    assert [w for w in shlex.split(install)[2:] if w not in demo_words] == [], (install, demo)


def test_extract_steps_refuses_an_unmarked_block():
    text = f"{SECTION}\n\n<!-- walkthrough: run -->\n```bash\necho hi\n```\n\n```bash\nrm -rf x\n```\n"
    with pytest.raises(AssertionError, match="has no <!-- walkthrough"):
        extract_steps(text)


class PortMap:
    """The README's fixed ports swapped for free ones: in commands, files and configuration."""

    def __init__(self) -> None:
        self.ports = {port: free_port() for port in README_PORTS}

    def apply(self, text: str) -> str:
        """`127.0.0.1:<port>`, `localhost:<port>` and `--port <port>` with the test's ports."""

        def swap(match: re.Match) -> str:
            port = int(match.group("port"))
            assert port in self.ports, (f"the walkthrough uses port {port} ({match.group(0)!r}), which the "
                                        f"test does not know: add it to README_PORTS with its override")
            return match.group(0)[:match.start("port") - match.start(0)] + str(self.ports[port])

        return re.sub(r"(?:127\.0\.0\.1:|localhost:|--port )(?P<port>\d+)\b", swap, text)

    def environment(self) -> dict[str, str]:
        """What moves each server (etcd's own ETCD_* variables, the configuration files' overrides)."""
        etcd = f"127.0.0.1:{self.ports[2379]}"
        peer = f"http://127.0.0.1:{self.ports[2380]}"
        return {
            "ETCD_LISTEN_CLIENT_URLS": f"http://{etcd}", "ETCD_ADVERTISE_CLIENT_URLS": f"http://{etcd}",
            "ETCD_LISTEN_PEER_URLS": peer, "ETCD_INITIAL_ADVERTISE_PEER_URLS": peer,
            "ETCD_INITIAL_CLUSTER": f"default={peer}",
            "DANUBE_META_STORE__PORT": str(self.ports[2379]),
            "DANUBE_BROKER__PORTS__CLIENT": str(self.ports[6650]),
            "DANUBE_BROKER__PORTS__ADMIN": str(self.ports[50051]),
            "DANUBE_ETCD_ENDPOINTS": etcd,                 # conf/pipelines/orders.yaml
            "SPEEDLAYER_ETCD__ENDPOINTS": etcd,
            "SPEEDLAYER_GATEWAY__PORT": str(self.ports[7800]),
        }


def test_output_blocks_match_line_for_line_with_an_ellipsis_for_what_varies():
    block = "n | amount\n--+-------\n3 | 235.0\n3 row(s) in … ms\n"
    assert output_matches("n | amount\n--+-------\n3 | 235.0 \n3 row(s) in 108.5 ms\n", block)
    assert not output_matches("n | amount\n--+-------\n3 | 236.0\n3 row(s) in 108.5 ms\n", block)
    assert not output_matches("n | amount\n--+-------\n3 | 235.0\n", block)


def test_configuration_files_listen_where_the_readme_says():
    """The test moves the servers through environment overrides; without them, each
    configuration file must put its server on the README's port."""
    broker = yaml.safe_load((REPO_ROOT / "conf" / "broker.yaml").read_text())
    assert (broker["meta_store"]["host"], broker["meta_store"]["port"]) == ("127.0.0.1", 2379)
    assert broker["meta_store"]["embedded"] is False  # step 1 starts etcd; the broker never does unasked
    assert broker["broker"]["ports"] == {"client": 6650, "admin": 50051}
    speedlayer = yaml.safe_load((REPO_ROOT / "conf" / "speedlayer.yaml").read_text())
    assert speedlayer["etcd"]["endpoints"] == "127.0.0.1:2379"
    assert (speedlayer["gateway"]["host"], speedlayer["gateway"]["port"]) == ("127.0.0.1", 7800)
    pipeline = yaml.safe_load((REPO_ROOT / "conf" / "pipelines" / "orders.yaml").read_text())
    assert pipeline["source"]["etcd_endpoints"] == "${DANUBE_ETCD_ENDPOINTS:-127.0.0.1:2379}"


def fresh_checkout(root: Path) -> Path:
    """A directory that looks like the root of a fresh clone: links to the checkout's entries."""
    root.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in NOT_LINKED and not entry.name.endswith(".egg-info"):
            (root / entry.name).symlink_to(entry)
    return root


def user_environment(root: Path, ports: PortMap) -> dict[str, str]:
    """The environment of a user's shell: this interpreter as `python`, no stray overrides."""
    bin_dir = root.parent / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DANUBE_", "SPEEDLAYER_", "ETCD_", "PYTHONPATH"))}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(ports.environment())
    return env


class Terminal:
    """A long-running command in "another terminal": its own process group, output in a file."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.command = command
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(["bash", "-c", command], cwd=str(cwd), env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, deadline_s: float) -> None:
        """Until the command prints `text`, as a user waits for it; fails at once if it exits."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.process.poll() is not None:
                pytest.fail(f"`{self.command}` exited ({self.process.returncode}) before printing "
                            f"{text!r}:\n{self.output()[-4000:]}")
            time.sleep(0.1)
        pytest.fail(f"`{self.command}` did not print {text!r} within {deadline_s}s:\n{self.output()[-4000:]}")

    def interrupt(self) -> None:
        """Ctrl-C, then SIGKILL for a process group still there after the grace period."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run one command as a user's shell does; its output is appended to `../transcript.txt`."""
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", command], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)
    with open(cwd.parent / "transcript.txt", "a") as transcript:
        transcript.write(f"$ {command}\n{done.stdout}{done.stderr}[exit {done.returncode}, "
                         f"{time.monotonic() - started:.1f} s]\n\n")
    return done


def run_checked(command: str, cwd: Path, env: dict[str, str]) -> str:
    done = run(command, cwd, env)
    assert done.returncode == 0, (f"README command failed ({done.returncode}): {command}\n"
                                  f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}")
    return done.stdout


def run_until(command: str, text: str, cwd: Path, env: dict[str, str]) -> str:
    """Re-run `command` until its output holds `text`, as a user re-runs `status`."""
    deadline = time.monotonic() + UNTIL_DEADLINE_S
    while True:
        done = run(command, cwd, env)
        if done.returncode == 0 and text in done.stdout:
            return done.stdout
        if time.monotonic() > deadline:
            pytest.fail(f"`{command}` did not print {text!r} within {UNTIL_DEADLINE_S}s; last run "
                        f"({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        time.sleep(0.5)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for terminal in reversed(started):
        terminal.interrupt()


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 2 minutes, most of it the spark-submit run
def test_readme_walkthrough_runs_as_written(tmp_path, terminals):
    steps = extract_steps(README.read_text())
    checkout_had = [name for name in USER_FILES if (REPO_ROOT / name).exists()]
    ports = PortMap()
    root = fresh_checkout(tmp_path / "clone")
    env = user_environment(root, ports)
    logs = tmp_path / "terminals"
    logs.mkdir()
    last_output = ""
    for number, step in enumerate(steps):
        if step.kind == "file":
            (root / step.argument).write_text(ports.apply(step.body))
        elif step.kind == "terminal":
            (command,) = step.commands()
            terminal = Terminal(ports.apply(command), root, env, logs / f"{number}.log")
            terminals.append(terminal)
            terminal.wait_for(step.argument, TERMINAL_READY_S)
        elif step.kind == "run":
            for command in step.commands():
                if step.argument:
                    last_output = run_until(ports.apply(command), step.argument, root, env)
                else:
                    last_output = run_checked(ports.apply(command), root, env)
        else:
            assert output_matches(last_output, step.body), (
                f"the walkthrough's output block says:\n{step.body}\nbut the command printed:\n{last_output}")
    for terminal in reversed(terminals):
        terminal.interrupt()
        assert terminal.process.returncode in (0, -signal.SIGINT, 130), (
            f"`{terminal.command}` did not stop cleanly on Ctrl-C ({terminal.process.returncode}):\n"
            f"{terminal.output()[-4000:]}")
    assert [name for name in USER_FILES if (REPO_ROOT / name).exists()] == checkout_had, (
        "the walkthrough wrote into the checkout, not the test's directory")


def output_matches(printed: str, expected: str) -> bool:
    """Whether `printed` is the README's output block, line for line; `…` in the block stands
    for text that changes from run to run (a latency)."""
    printed_lines = [line.rstrip() for line in printed.strip().splitlines()]
    expected_lines = [line.rstrip() for line in expected.strip().splitlines()]
    return len(printed_lines) == len(expected_lines) and all(
        re.fullmatch(".+".join(re.escape(part) for part in want.split("…")), got)
        for got, want in zip(printed_lines, expected_lines))
