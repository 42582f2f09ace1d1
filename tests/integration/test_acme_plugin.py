"""A real third-party plugin end to end: pip install, kreg plugins, explain, its own op through
``kreg bench``, ``kreg tune``, ``torch.ops`` and the conformance kit, its device profile, and
uninstall.

``examples/acme-plugin`` (distribution ``acme-kreg``, package ``acme_kreg``, entry point ``acme``)
and its deliberately broken copy ``examples/acme-plugin-broken`` (``acme_broken``, a kernel that
drops each row's last valid index) are built with hatchling and pip-installed into the
``overlay`` environment (tests/integration/plugin_env.py), then exercised in subprocesses exactly
as a user would.
"""

from __future__ import annotations

import json
from pathlib import Path

from plugin_env import Overlay

REPO = Path(__file__).resolve().parents[2]
ACME = REPO / "examples" / "acme-plugin"
BROKEN = REPO / "examples" / "acme-plugin-broken"

L20_BIG = ["-w", "kind=prefill,topk=2048,head_dim=128,group_size=8,num_kv_heads=1",
           "-w", "total_q=4096,num_requests=1,max_q=4096,dtype=bfloat16"]
L20_SMALL = ["-w", "kind=prefill,topk=2048,head_dim=128,group_size=8,num_kv_heads=1",
             "-w", "total_q=512,num_requests=1,max_q=512,dtype=bfloat16"]


def _plugin_names(ov: Overlay) -> dict[str, dict[str, object]]:
    return {p["name"]: p for p in json.loads(ov.kreg("plugins", "--json"))}


def _decision(ov: Overlay, device: str, workload: list[str], op: str = "sparse_prefill",
              env: dict[str, str] | None = None) -> dict[str, object]:
    return json.loads(ov.kreg("explain", op, "--device", device, *workload, "--json", env=env))


def _acme(d: dict[str, object]) -> dict[str, object]:
    return next(c for c in d["candidates"]  # type: ignore[attr-defined]
                if c["implementation"] == "acme.sparse_prefill_blocked")


def test_acme_plugin_install_explain_conformance_uninstall(overlay: Overlay,
                                                           tmp_path: Path) -> None:
    ov = overlay
    assert "acme" not in _plugin_names(ov)
    try:
        ov.install(ACME)

        # kreg plugins lists it, loaded, with its op and implementations
        plugins = _plugin_names(ov)
        assert plugins["acme"]["loaded"] and not plugins["acme"]["errors"]
        assert plugins["acme"]["ops"] == ["acme_rmsnorm"]
        assert plugins["acme"]["implementations"] == [
            "acme.sparse_prefill_blocked", "acme.rmsnorm_reference", "acme.rmsnorm_triton"]
        assert "acme.sparse_prefill_blocked (op sparse_prefill, priority 100)" in ov.kreg("plugins")

        # chosen where its requirements hold: sm_89 (L20), prefill >= 1024 rows
        d = _decision(ov, "l20", L20_BIG)
        assert d["implementation"] == "acme.sparse_prefill_blocked"
        assert d["config"] == {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}

        # not elsewhere, and explain says why: the H200 is sm_90 ...
        d = _decision(ov, "h200", L20_BIG)
        assert d["implementation"] == "generic.sparse_prefill_table"
        failed = {c["name"]: c for c in _acme(d)["checks"] if not c["passed"]}  # type: ignore
        assert set(failed) == {"arch"}
        assert (failed["arch"]["observed"], failed["arch"]["required"]) == ("sm_90", "sm_89")
        text = ov.kreg("explain", "sparse_prefill", "--device", "h200", *L20_BIG)
        assert "arch: sm_90, requires sm_89 [envelope]" in text
        # ... and on the L20 a small batch is outside the measured envelope
        d = _decision(ov, "l20", L20_SMALL)
        assert d["implementation"] == "generic.sparse_prefill_table"
        assert [c["name"] for c in _acme(d)["checks"] if not c["passed"]] == [  # type: ignore
            "total_q [kind=prefill]"]
        # an AMD device fails the vendor check too
        d = _decision(ov, "mi355x", L20_BIG)
        assert {"vendor", "arch"} <= {c["name"] for c in _acme(d)["checks"]  # type: ignore
                                      if not c["passed"]}

        # the profile it ships (kreg_profiles): listed with the plugin as its source, and an
        # sm_89 part kreg ships no profile of, where the blocked geometry is chosen
        profiles = json.loads(ov.kreg("profiles", "--json"))
        assert profiles["l40s"]["source"] == "plugin acme"
        assert profiles["l40s"]["facts"]["compute_capability"] == [8, 9]
        assert profiles["l40s"]["facts"]["extra"] == {"ecc": "on"}
        d = _decision(ov, "l40s", L20_BIG)
        assert d["implementation"] == "acme.sparse_prefill_blocked"
        assert d["facts"]["profile"] == "l40s"  # type: ignore[index]
        assert ov.kreg("explain", "sparse_prefill", "--device", "l40s", *L20_BIG).startswith(
            "sparse_prefill on l40s: NVIDIA L40S (sm_89, 142 SMs;")

        # its own op: kreg ops, kreg bench, the kit, kreg tune, torch.ops
        assert "defined by plugin acme; reference acme.rmsnorm_reference; kreg bench, " \
               "kreg tune, conformance cases, custom op" in ov.kreg("ops")
        report = json.loads(ov.kreg("bench", "acme_rmsnorm", "--rows", "8", "--cols", "64",
                                    "--warmup", "1", "--iters", "2", "--json"))
        assert report["schema"] == "kreg.bench/1" and report["op"] == "acme_rmsnorm"
        assert {m["label"] for m in report["cases"][0]["results"]} == {
            "reference", "auto", "acme.rmsnorm_triton"}
        assert all(m["status"] == "ok" for m in report["cases"][0]["results"])
        table = ov.kreg("bench", "acme_rmsnorm", "--rows", "8", "--cols", "64", "--warmup", "1",
                        "--iters", "2")
        assert table.startswith("# acme_rmsnorm on ") and "plain launches" in table, table

        proc = ov.pytest_kit("--kreg-conformance", "acme", cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert " passed" in out and "failed" not in out and "skipped" not in out, out
        assert "acme_rmsnorm: 2 of the 2 configs plugin 'acme' offers executed" in out, out
        assert "acme.rmsnorm_triton[cpu-float16-ragged_cols]" not in out  # passed quietly

        home = {"KREG_HOME": str(tmp_path / "home")}  # a store of its own
        wl = ["-w", "rows=32,cols=64,dtype=float32"]
        before = json.loads(ov.kreg("explain", "acme_rmsnorm", *wl, "--json", env=home))
        assert before["implementation"] == "acme.rmsnorm_triton"
        tuned = ov.kreg("tune", "acme_rmsnorm", "--grid", "rows=8,32", "--grid", "cols=64",
                        "--warmup", "1", "--iters", "2", "--min-gain", "0", env=home)
        assert "8x64 float32: measured" in tuned and "32x64 float32: measured" in tuned, tuned
        after = json.loads(ov.kreg("explain", "acme_rmsnorm", *wl, "--json", env=home))
        assert after["implementation"] == "measured.acme_rmsnorm"

        code = ("import torch, registry\n"
                "ops = registry.load_custom_ops()\n"
                "assert ops['acme_rmsnorm'] == 'acme_kreg.rmsnorm.torch_op', ops\n"
                "from acme_kreg.rmsnorm import reference\n"
                "x, w = torch.randn(6, 40), torch.randn(40)\n"
                "f = torch.compile(lambda x, w: torch.ops.acme.rmsnorm(x, w) * 2, fullgraph=True,"
                " backend='eager')\n"
                "torch.testing.assert_close(f(x, w), reference(x, w) * 2)\n"
                "print('ok')\n")
        assert ov.ok("-c", code).strip().endswith("ok")

        # the broken copy is caught, and the failing cases are named
        ov.install(BROKEN)
        assert "acme_broken" in _plugin_names(ov)
        proc = ov.pytest_kit("--kreg-conformance", "acme_broken", "-k",
                             "float32 and (random or lengths or chunk_ragged)", cwd=tmp_path)
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
    assert "l40s" not in json.loads(ov.kreg("profiles", "--json"))
