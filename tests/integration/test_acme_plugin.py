"""A real third-party plugin end to end: pip install, kreg plugins, explain, conformance, uninstall.

``examples/acme-plugin`` (distribution ``acme-kreg``, package ``acme_kreg``, entry point ``acme``)
and its deliberately broken copy ``examples/acme-plugin-broken`` (``acme_broken``, a kernel that
drops each row's last valid index) are built with hatchling and pip-installed, then exercised
in subprocesses exactly as a user would.

They are installed into a throwaway *overlay* environment: a venv whose ``.pth`` file adds the
running venv's site-packages (kreg's editable install, torch, pytest, hatchling). Installing into
the running venv itself would make the plugin visible, for a minute, to every other test process
that shares it (their ``kreg plugins`` output and selections would change under them). pip
installs and uninstalls in the overlay exactly as it would in the venv.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import site
import subprocess
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

import registry

REPO = Path(__file__).resolve().parents[2]
ACME = REPO / "examples" / "acme-plugin"
BROKEN = REPO / "examples" / "acme-plugin-broken"

L20_BIG = ["-w", "kind=prefill,topk=2048,head_dim=128,group_size=8,num_kv_heads=1",
           "-w", "total_q=4096,num_requests=1,max_q=4096,dtype=bfloat16"]
L20_SMALL = ["-w", "kind=prefill,topk=2048,head_dim=128,group_size=8,num_kv_heads=1",
             "-w", "total_q=512,num_requests=1,max_q=512,dtype=bfloat16"]


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

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.python, *args], env=self.env, cwd=cwd, text=True,
                              capture_output=True, timeout=timeout, check=False)

    def ok(self, *args: str, cwd: Path | None = None) -> str:
        proc = self.run(*args, cwd=cwd)
        assert proc.returncode == 0, \
            f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def kreg(self, *args: str) -> str:
        return self.ok("-m", "cli", *args)

    def pip(self, *args: str) -> str:
        return self.ok("-m", "pip", *args)


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
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
            pytest.skip(f"hatchling (the example plugin's build backend) is not installed and "
                        f"pip could not install it: {proc.stderr.strip()[-300:]}")
    yield ov


def _pytest_plugin_args() -> list[str]:
    """``-p registry.testing`` until kreg's ``pytest11`` entry point is installed."""
    eps = importlib.metadata.entry_points(group="pytest11")
    if any(ep.value.split(":")[0] == "registry.testing" for ep in eps):
        return []
    return ["-p", "registry.testing"]


def _cases_args() -> list[str]:
    """Name the cases module explicitly while OpSpec.conformance is not set yet."""
    spec = registry.get_registry().spec("sparse_prefill")
    if spec.conformance:
        return []
    return ["--kreg-conformance-cases", "sparse_prefill=backends.sparse_prefill.conformance"]


def _plugin_names(ov: Overlay) -> dict[str, dict[str, object]]:
    return {p["name"]: p for p in json.loads(ov.kreg("plugins", "--json"))}


def _decision(ov: Overlay, device: str, workload: list[str]) -> dict[str, object]:
    return json.loads(ov.kreg("explain", "sparse_prefill", "--device", device, *workload,
                              "--json"))


def test_acme_plugin_install_explain_conformance_uninstall(overlay: Overlay,
                                                           tmp_path: Path) -> None:
    ov = overlay
    assert "acme" not in _plugin_names(ov)
    try:
        ov.pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(ACME))

        # kreg plugins lists it, loaded, with its implementation
        plugins = _plugin_names(ov)
        assert plugins["acme"]["loaded"] and not plugins["acme"]["error"]
        assert plugins["acme"]["implementations"] == ["acme.sparse_prefill_blocked"]
        assert "acme.sparse_prefill_blocked (op sparse_prefill, priority 100)" in ov.kreg("plugins")

        # chosen where its requirements hold: sm_89 (L20), prefill >= 1024 rows
        d = _decision(ov, "l20", L20_BIG)
        assert d["implementation"] == "acme.sparse_prefill_blocked"
        assert d["config"] == {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}

        # not elsewhere, and explain says why: the H200 is sm_90 ...
        d = _decision(ov, "h200", L20_BIG)
        assert d["implementation"] == "generic.sparse_prefill_table"
        acme = next(c for c in d["candidates"]
                    if c["implementation"] == "acme.sparse_prefill_blocked")
        failed = {c["name"]: c for c in acme["checks"] if not c["passed"]}
        assert set(failed) == {"arch"}
        assert (failed["arch"]["observed"], failed["arch"]["required"]) == ("sm_90", "sm_89")
        text = ov.kreg("explain", "sparse_prefill", "--device", "h200", *L20_BIG)
        assert "arch: sm_90, requires sm_89 [envelope]" in text
        # ... and on the L20 a small batch is outside the measured envelope
        d = _decision(ov, "l20", L20_SMALL)
        assert d["implementation"] == "generic.sparse_prefill_table"
        acme = next(c for c in d["candidates"]
                    if c["implementation"] == "acme.sparse_prefill_blocked")
        assert [c["name"] for c in acme["checks"] if not c["passed"]] == [
            "total_q [kind=prefill]"]
        # an AMD device fails the vendor check too
        d = _decision(ov, "mi355x", L20_BIG)
        acme = next(c for c in d["candidates"]
                    if c["implementation"] == "acme.sparse_prefill_blocked")
        assert {"vendor", "arch"} <= {c["name"] for c in acme["checks"] if not c["passed"]}

        # the conformance kit passes on it (envelope waived by :measure, so it runs here)
        proc = ov.run("-m", "pytest", *_pytest_plugin_args(), "--kreg-conformance", "acme",
                      *_cases_args(), "-q", "-p", "no:cacheprovider", cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert " passed" in out and "failed" not in out and "skipped" not in out, out

        # the broken copy is caught, and the failing cases are named
        ov.pip("install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(BROKEN))
        assert "acme_broken" in _plugin_names(ov)
        proc = ov.run("-m", "pytest", *_pytest_plugin_args(), "--kreg-conformance",
                      "acme_broken", *_cases_args(), "-q", "-p", "no:cacheprovider",
                      "-k", "float32 and (random or lengths or chunk_ragged)", cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out
        for case in ("random", "lengths", "chunk_ragged"):
            assert f"FAILED acme_broken.sparse_prefill_blocked[cpu-float32-{case}]" in out \
                or f"FAILED acme_broken.sparse_prefill_blocked[cuda-float32-{case}]" in out, out
        assert "max |" in out, out  # the violation: the worst element against the bound
    finally:
        proc = ov.run("-m", "pip", "uninstall", "-y", "acme-kreg", "acme-kreg-broken")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    plugins = _plugin_names(ov)
    assert "acme" not in plugins and "acme_broken" not in plugins
    assert ov.run("-c", "import acme_kreg").returncode != 0
