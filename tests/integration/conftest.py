"""Shared fixtures of the integration tests: ``overlay`` (see plugin_env.py)."""

from __future__ import annotations

import site
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_env import Overlay


@pytest.fixture(scope="session")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlay]:
    root = tmp_path_factory.mktemp("overlay")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    purelib = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    here = [p for p in site.getsitepackages() if Path(p).is_dir()]
    # An "import" line in a .pth file runs at start-up: addsitedir also processes the running
    # venv's own .pth files (kreg's editable install).
    (purelib / "_kreg_overlay.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in here))
    ov = Overlay(root, tmp_path_factory.mktemp("kreg_home"))
    if ov.run("-c", "import hatchling").returncode != 0:
        proc = ov.run("-m", "pip", "install", "-q", "hatchling>=1.24", timeout=180)
        if proc.returncode != 0:
            pytest.skip(f"hatchling (the example plugins' build backend) is not installed and "
                        f"pip could not install it: {proc.stderr.strip()[-300:]}")
    yield ov
