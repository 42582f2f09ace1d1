"""Packaging and isolation (issue #24): what the install exposes, a shadowed kreg package, and a
test suite that does not depend on which other plugins are installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KREG_", "PYTHONPATH"))}
    return {**env, **extra}


def _run(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=_clean_env(**env),
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_install_exposes_kreg_packages_only(tmp_path: Path) -> None:
    """Outside the checkout, tests/benchmarks/examples/docs are not importable (the editable
    install maps kreg's four top-level names, not the repository root)."""
    code = ("import importlib.util as u\n"
            "for n in ('registry', 'backends', 'plugins', 'cli', 'tests', 'benchmarks', "
            "'examples', 'docs'):\n"
            "    print(n, u.find_spec(n) is not None)\n")
    out = _run(code, tmp_path).stdout.split()
    found = dict(zip(out[::2], out[1::2], strict=True))
    assert found == {"registry": "True", "backends": "True", "plugins": "True", "cli": "True",
                     "tests": "False", "benchmarks": "False", "examples": "False",
                     "docs": "False"}


def test_the_wheel_and_the_editable_install_name_the_same_packages() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = cfg["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["only-include"] == ["registry", "backends", "plugins", "cli.py"]
    assert wheel["dev-mode-exact"] is True  # else the editable .pth adds the repository root


@pytest.mark.parametrize("name", ["plugins", "backends"])
def test_a_shadowing_package_on_sys_path_fails_with_the_path_and_the_fix(
        tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")  # an application's own package
    code = ("import registry\n"
            "try:\n"
            "    registry.select('indexer_topk', dict(k=4, num_rows=64, max_keys=8, "
            "dtype='float32'), 'h200')\n"
            "except registry.errors.PluginError as exc:\n"
            "    print('PluginError:', exc)\n")
    # `python -c` puts the working directory first on sys.path, as an application's launcher does
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"kreg's package {name!r} is shadowed" in proc.stdout
    assert str(tmp_path / name) in proc.stdout
    assert "Fix: rename that package, or run from another directory" in proc.stdout


def test_no_shadowing_no_complaint(tmp_path: Path) -> None:
    for name in ("myapp", "tests"):  # packages of other names shadow nothing of kreg's
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    proc = _run("import registry; print(registry.select('indexer_topk', dict(k=4, num_rows=64, "
                "max_keys=8, dtype='float32'), 'h200').implementation)", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("generic.")


def test_the_suite_selects_with_kreg_plugins_only(tmp_path: Path) -> None:
    """With examples/acme-plugin installed (here: its entry point on PYTHONPATH), the policy
    tests still see kreg's plugins only; before, the acme plugin took the L20 case."""
    site = tmp_path / "site"
    info = site / "acme_kreg-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-kreg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kreg]\nacme = acme_kreg\n")
    env = _clean_env(PYTHONPATH=os.pathsep.join(
        [str(site), str(ROOT / "examples" / "acme-plugin" / "src")]),
        KREG_HOME=str(tmp_path / "home"))
    probe = subprocess.run([sys.executable, "-c", "import registry; print(sorted(registry."
                            "get_registry().plugins))"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120, check=True)
    assert "acme" in probe.stdout  # the plugin is visible to an ordinary process
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/unit/test_sm120_policy.py::test_other_devices_take_the_table"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout
