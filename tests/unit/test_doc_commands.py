"""Every shell command in README.md and docs/*.md code blocks runs and exits 0 (issue #24).

Commands are discovered, not listed: each fenced block in a shell-like language (``sh``, ``bash``,
``console``, ``shell`` or none) is read; in a block with ``$ `` prompts the prompted lines are
commands (the rest is their output), otherwise every line that starts with a command word or a
``VAR=value`` assignment is one (JSON and other text are skipped); backslash continuations are
joined and ``# comments`` dropped. A ``kreg ...`` command and ``python benchmarks/...`` run, on the
CPU (Triton under its interpreter), in an empty KREG_HOME. Everything else must match one of
the EXCEPTIONS below, each with its reason; a new kind of command fails this test until it is
classified here. Runs are bounded (RUN_TIMEOUT_S each); long benchmarks are shrunk (SHRINK).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"", "sh", "bash", "console", "shell", "shell-session"}
COMMAND_WORDS = {"kreg", "python", "python3", "make", "pip", "pip3", "pytest", "git", "cd",
                 "export", "env", "bash", "sh", "uv", "docker"}
RUN_TIMEOUT_S = 60

#: (pattern on the command, why it is not run here). First match wins.
EXCEPTIONS: list[tuple[str, str]] = [
    (r"\.\.\.", "elided arguments ('...'): an abbreviation, not a complete command"),
    (r"\$\{?[A-Za-z_]", "uses a shell variable the doc defines for a long-running run"),
    (r"^[A-Za-z_][A-Za-z0-9_]*=\S*$|^[A-Za-z_][A-Za-z0-9_]*=[\"']",
     "a shell variable assignment for the commands after it"),
    (r"^make (demo|test)\b", "set-up: builds .venv and runs the demo or the whole suite (CI runs "
                             "make test)"),
    (r"^pip3? install\b", "installs a package into the environment (tests/integration/"
                          "test_acme_plugin.py installs the example plugin in an overlay)"),
    (r"^pytest --kreg-conformance\b", "needs a third-party plugin installed (tests/integration/"
                                      "test_acme_plugin.py runs the kit on the example plugin)"),
    (r"^kreg bench\b", "GPU-only at the documented sizes: minutes on a GPU, far longer under the "
                       "CPU interpreter (tests/unit/test_bench_schema.py runs kreg bench small)"),
    (r"^kreg tune\b", "long-running: measures every config of a grid (tests/integration/"
                      "test_tune.py and tests/unit/test_cli_messages.py run tiny grids)"),
    (r"^python3? benchmarks/bench_regret\.py\b", "GPU measurement of selection regret over a "
                                                  "tuning grid: long-running"),
    (r"^kreg daemon start\b(?!.*--foreground)", "starts a background service (tests/integration/"
                                                "test_daemon.py starts and stops one)"),
    (r"\b(workloads\.jsonl|kreg\.lock|old\.lock)\b",
     "reads a lockfile or a workloads file the reader writes first (tests/unit/test_lock.py "
     "locks the seed's sweep on five profiles and verifies it, with each drift)"),
    (r"\bacme[_.]|--kreg-conformance acme\b",
     "needs the example plugin installed (tests/integration/test_acme_plugin.py installs it and "
     "runs these commands on it)"),
    (r"\bserve\.py\b", "the reader's own serving process"),
]

#: Long but CPU-capable commands, run with smaller settings (arguments appended).
SHRINK: dict[str, list[str]] = {
    "benchmarks/bench_daemon.py": ["--clients", "2", "--selects", "20", "--rate", "200",
                                   "--abuse", "10"],
    "benchmarks/bench_check_mode.py": [],
}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _is_command(line: str) -> bool:
    first = line.split()[0] if line.split() else ""
    return (first in COMMAND_WORDS or bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", first))
            or first.endswith(("/python", "/kreg")))


def _strip_comment(text: str) -> str:
    """``text`` without a trailing ``# comment`` (a ``#`` after whitespace, outside quotes)."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip()
    return text.strip()


def discover() -> list[Command]:
    out: list[Command] = []
    fence = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in fence.finditer(text):
            if block.group(1).strip().lower() not in SHELL_LANGS:
                continue
            first_line = text.count("\n", 0, block.start(2)) + 1
            lines = block.group(2).splitlines()
            prompted = any(ln.startswith("$ ") for ln in lines)
            i = 0
            while i < len(lines):
                start, line = i, lines[i]
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
                if prompted:
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                elif not _is_command(line):
                    continue
                cmd = _strip_comment(line)
                if cmd:
                    out.append(Command(doc.relative_to(ROOT).as_posix(), first_line + start, cmd))
    return out


COMMANDS = discover()


def _exception(cmd: str) -> str | None:
    return next((why for pattern, why in EXCEPTIONS if re.search(pattern, cmd)), None)


def _argv(cmd: str) -> list[str] | None:
    """The argv to run ``cmd`` with, or None when it is not a command this test runs."""
    words = shlex.split(cmd)
    if words[0] == "kreg":
        script = Path(sys.executable).parent / "kreg"
        head = [str(script)] if script.exists() else [sys.executable, str(ROOT / "cli.py")]
        return head + words[1:]
    if words[0] in ("python", "python3") and len(words) > 1 and \
            words[1].startswith("benchmarks/"):
        return [sys.executable, *words[1:], *SHRINK.get(words[1], [])]
    return None


def test_commands_are_found() -> None:
    assert len(COMMANDS) >= 5
    assert any(c.text.startswith("kreg explain") for c in COMMANDS)


def test_every_command_is_run_or_excepted_with_a_reason() -> None:
    unclassified = [str(c) for c in COMMANDS
                    if _exception(c.text) is None and _argv(c.text) is None]
    assert unclassified == [], ("classify these documented commands (run them, or add an "
                                "exception with its reason):\n" + "\n".join(unclassified))


RUNNABLE = [c for c in COMMANDS if _exception(c.text) is None and _argv(c.text) is not None]


@pytest.mark.parametrize("command", RUNNABLE, ids=[f"{c.doc}:{c.line}" for c in RUNNABLE])
def test_documented_command_exits_0(command: Command, tmp_path: Path) -> None:
    argv = _argv(command.text)
    assert argv is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREG_")}
    env.update(KREG_HOME=str(tmp_path / "home"), TRITON_INTERPRET="1",
               KREG_PLUGINS=os.environ.get("KREG_PLUGINS", ""))
    cwd = ROOT if argv[0] == sys.executable else tmp_path  # kreg writes relative paths here
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, (f"{command} exited {proc.returncode}:\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def test_example_docstrings_name_their_own_implementations() -> None:
    """``NAME:measure`` in an example plugin's docstring names one of its implementations
    (the broken example named acme's)."""
    for init in sorted((ROOT / "examples").glob("*/src/*/__init__.py")):
        text = init.read_text()
        names = set(re.findall(r'name="([a-z0-9_]+\.[a-z0-9_]+)"', text))
        for named in re.findall(r"``([a-z0-9_]+\.[a-z0-9_]+):measure``", text):
            assert named in names, f"{init.relative_to(ROOT)} names {named}, registers {names}"
