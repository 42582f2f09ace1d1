"""``Overlay``: a throwaway environment to ``pip install`` plugin distributions into, as a user
would (the ``overlay`` fixture of tests/integration/conftest.py): a venv whose ``.pth`` file adds
the running venv's site-packages (kreg's editable install, torch, pytest, hatchling). Installing
into the running venv itself would make the plugin visible, for a minute, to every other test
process that shares it (their ``kreg plugins`` output and selections would change under them).
pip installs and uninstalls in the overlay exactly as it would in the venv.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from pathlib import Path


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class Overlay:
    def __init__(self, root: Path, home: Path) -> None:
        self.root = root
        self.python = str(root / "bin" / "python")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("KREG_") and k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
        self.env.update({"KREG_HOME": str(home), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                         "PIP_NO_INPUT": "1", "PYTHONDONTWRITEBYTECODE": "1"})
        if not _has_gpu():
            self.env["TRITON_INTERPRET"] = "1"

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 180,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.python, *args], env={**self.env, **(env or {})}, cwd=cwd,
                              text=True, capture_output=True, timeout=timeout, check=False)

    def ok(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
        proc = self.run(*args, cwd=cwd, env=env)
        assert proc.returncode == 0, \
            f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def kreg(self, *args: str, env: dict[str, str] | None = None) -> str:
        return self.ok("-m", "cli", *args, env=env)

    def pip(self, *args: str) -> str:
        return self.ok("-m", "pip", *args)

    def install(self, path: Path) -> None:
        self.pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(path))

    def pytest_kit(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """``pytest --kreg-conformance ...`` in the overlay (``-p registry.testing`` until
        kreg's pytest11 entry point is installed)."""
        eps = importlib.metadata.entry_points(group="pytest11")
        load = [] if any(ep.value.split(":")[0] == "registry.testing" for ep in eps) else [
            "-p", "registry.testing"]
        return self.run("-m", "pytest", *load, "-q", "-p", "no:cacheprovider", *args, cwd=cwd,
                        timeout=600)
