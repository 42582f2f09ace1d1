"""benchmarks/probes/check_installed.py: a lent-machine call refuses a kreg wheel built before
the tree's last edit (the installed copy shadows the tree on PYTHONPATH)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "probes" / "check_installed.py"


def _load():
    spec = importlib.util.spec_from_file_location("check_installed", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    for pkg in ("backends", "registry", "plugins"):
        shutil.copytree(ROOT / pkg, site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "cli.py", site / "cli.py")
    return site


def _run(site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(site)], capture_output=True,
                          text=True, timeout=60)


def test_a_copy_of_the_tree_passes(tmp_path):
    site = _site(tmp_path)
    assert _load().stale_files(site, ROOT) == []
    res = _run(site)
    assert res.returncode == 0, res.stderr
    assert "holds this tree's kreg" in res.stdout


def test_an_edited_missing_or_extra_module_fails_and_names_it(tmp_path):
    site = _site(tmp_path)
    kernel = site / "backends" / "indexer_topk" / "config.py"
    kernel.write_text(kernel.read_text() + "\n# an older build\n")
    (site / "registry" / "__init__.py").unlink()
    (site / "plugins" / "gone_since.py").write_text("x = 1\n")
    stale = _load().stale_files(site, ROOT)
    assert "backends/indexer_topk/config.py" in stale
    assert "plugins/gone_since.py" in stale and "registry/__init__.py" in stale
    assert len(stale) == 3
    res = _run(site)
    assert res.returncode == 2
    assert "backends/indexer_topk/config.py" in res.stderr
    assert "pip wheel --no-deps -w .whl ." in res.stderr       # the fix, not a traceback
    assert "Traceback" not in res.stderr


def test_no_kreg_installed_fails_with_the_fix(tmp_path):
    res = _run(tmp_path)
    assert res.returncode == 2
    assert "no kreg in" in res.stderr and "carry .whl" in res.stderr
    assert _run(tmp_path / "a" / "b").returncode == 2
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "usage" in res.stderr
