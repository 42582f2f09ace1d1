"""A vendor describes a device kreg ships no profile for, through a profile file its plugin ships.

``tests/fixtures/b200_plugin`` (distribution ``kreg-b200-example``, entry point ``b200``) is
pip-installed into the ``overlay`` environment (tests/integration/plugin_env.py). Its profile
``b200`` sets ``compute_capability`` and an ``extra`` fact, its ``kreg_enrich_facts`` adds
another, and its implementation requires all three: ``kreg explain --device b200`` chooses it
inside its envelope, rejects it with the right kinds outside it, and
``kreg explain --device path/to/b200.toml`` decides the same. The conformance kit cannot pass on
nothing for it: on this machine every item is skipped, so the run fails naming the option that
makes it run, which then passes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from plugin_env import Overlay

REPO = Path(__file__).resolve().parents[2]
B200 = REPO / "tests" / "fixtures" / "b200_plugin"

BIG = ["-w", "kind=prefill,topk=2048,head_dim=128,group_size=8,num_kv_heads=1",
       "-w", "total_q=4096,num_requests=1,max_q=4096,dtype=bfloat16"]
SMALL = ["-w", "kind=prefill,topk=2048,head_dim=128,group_size=8,num_kv_heads=1",
         "-w", "total_q=512,num_requests=1,max_q=512,dtype=bfloat16"]
IMPL = "b200.sparse_prefill_tma"


def _explain(ov: Overlay, *args: str) -> dict[str, Any]:
    return json.loads(ov.kreg("explain", "sparse_prefill", *args, "--json"))


def _failed(d: dict[str, Any]) -> dict[str, str]:
    cand = next(c for c in d["candidates"] if c["implementation"] == IMPL)
    return {c["name"]: c["kind"] for c in cand["checks"] if not c["passed"] and not c["waived"]}


def test_a_plugin_profile_for_a_device_kreg_does_not_ship(overlay: Overlay,
                                                          tmp_path: Path) -> None:
    ov = overlay
    try:
        ov.install(B200)
        plugins = {p["name"]: p for p in json.loads(ov.kreg("plugins", "--json"))}
        assert plugins["b200"]["state"] == "loaded" and not plugins["b200"]["errors"]
        profiles = json.loads(ov.kreg("profiles", "--json"))
        assert profiles["b200"]["source"] == "plugin b200"
        facts = profiles["b200"]["facts"]
        assert facts["compute_capability"] == [10, 0] and facts["arch"] == "sm_100"
        # the profile's own extra fact, and the one the plugin's enrich hook adds to profiles
        assert facts["extra"] == {"tma_multicast": "1", "nvlink_generation": "5"}

        # inside the envelope: chosen, every check passed
        d = _explain(ov, "--device", "b200", *BIG)
        assert d["implementation"] == IMPL, d
        assert d["config"] == {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
        assert d["facts"]["profile"] == "b200" and _failed(d) == {}
        text = ov.kreg("explain", "sparse_prefill", "--device", "b200", *BIG)
        assert text.startswith("sparse_prefill on b200: NVIDIA B200 (sm_100, 148 SMs;"), text
        # outside it: a small batch fails the envelope only ...
        d = _explain(ov, "--device", "b200", *SMALL)
        assert d["implementation"] == "generic.sparse_prefill_table"
        assert _failed(d) == {"total_q [kind=prefill]": "envelope"}
        # ... a device it does not support fails the capability checks and the device set
        d = _explain(ov, "--device", "h200", *BIG)
        assert _failed(d) == {"arch": "capability", "compute_capability": "capability",
                              "tma_multicast": "capability", "nvlink_generation": "capability",
                              "device": "envelope"}
        # what-ifs on the profile: each capability fact alone
        d = _explain(ov, "--device", "b200", "--set", "compute_capability=9.0", *BIG)
        assert _failed(d) == {"compute_capability": "capability"}
        assert d["facts"]["profile"] == "b200 with compute_capability=9.0"
        d = _explain(ov, "--device", "b200", "--set", "extra.tma_multicast=0", *BIG)
        assert _failed(d) == {"tma_multicast": "capability"}
        # the enrich hook sees the changed facts: another name, no NVLink 5
        d = _explain(ov, "--device", "b200", "--set", "name=NVIDIA B100", *BIG)
        assert "nvlink_generation" in _failed(d) and "device" in _failed(d)

        # the profile file itself, and a copy of it elsewhere: the same decision
        where = ov.ok("-c", "from importlib.resources import files; "
                            "print(files('kreg_b200') / 'profiles' / 'b200.toml')").strip()
        by_name = _explain(ov, "--device", "b200", *BIG)
        by_file = _explain(ov, "--device", where, *BIG)
        assert {**by_file, "cached": None} == {**by_name, "cached": None}
        copy = tmp_path / "mine" / "b200.toml"
        copy.parent.mkdir()
        shutil.copy(where, copy)
        for workload in (BIG, SMALL):
            a = _explain(ov, "--device", "b200", *workload)
            b = _explain(ov, "--device", str(copy), *workload)
            assert (a["implementation"], a["config"], a["candidates"]) == (
                b["implementation"], b["config"], b["candidates"])
        assert ov.kreg("profiles", str(copy)).startswith(f"profile b200 (file {copy})")

        # the kit: nothing runs on this machine, and the run says so and how to run it
        proc = ov.pytest_kit("--kreg-conformance", "b200", "-k", "random or lengths",
                             cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out
        assert "FAILED: nothing of plugin 'b200' was tested: all 4 of its items were skipped" \
               in out, out
        assert "vendor: cpu, requires nvidia [capability]" in out
        assert "--kreg-conformance-device b200 (eligible on b200)" in out, out
        # (a profile name there is tested on nvidia_sm120: test_vendor_conformance.py)
        proc = ov.pytest_kit("--kreg-conformance", "b200", "--kreg-conformance-device",
                             str(copy), "-k", "random or lengths", cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert "kreg conformance b200: 4 executed (4 passed), judged on b200" in out, out
    finally:
        proc = ov.run("-m", "pip", "uninstall", "-y", "kreg-b200-example")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "b200" not in json.loads(ov.kreg("profiles", "--json"))
