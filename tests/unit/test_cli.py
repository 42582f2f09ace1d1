"""The kreg command through click's CliRunner (and one real subprocess for import weight)."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

import cli
import registry

SEED = ["-w", "kind=chunk,topk=2051,head_dim=256,group_size=6,num_kv_heads=1",
        "-w", "total_q=8192,num_requests=1,max_q=8192,dtype=bfloat16"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, list(args))
    return result.exit_code, result.output


def test_explain_on_a_profile_puts_the_choice_first() -> None:
    code, out = run("explain", "sparse_prefill", "--device", "rtx-pro-6000-blackwell-server",
                    *SEED)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("sparse_prefill on rtx-pro-6000-blackwell-server: NVIDIA RTX PRO")
    assert lines[2] == ("-> nvidia_sm120.sparse_prefill_tuned  config: BLOCK_M=8 BLOCK_N=16 "
                        "num_warps=4 num_stages=3")
    assert "CHOSEN" in out and "override: none" in out


def test_explain_what_if_triton_version() -> None:
    code, out = run("explain", "sparse_prefill", "--device", "rtx-pro-6000-blackwell-server",
                    "--set", "triton_version=3.6.0", *SEED)
    assert code == 0, out
    assert "-> generic.sparse_prefill_table" in out
    assert "triton: 3.6.0, requires >= 3.7 [capability]" in out


def test_explain_with_measure_override_on_the_5090() -> None:
    code, out = run("explain", "sparse_prefill", "--device", "rtx-5090", "--override",
                    "nvidia_sm120.sparse_prefill_tuned:measure", *SEED)
    assert code == 0, out
    assert "-> nvidia_sm120.sparse_prefill_tuned" in out
    assert "waived by :measure" in run("explain", "sparse_prefill", "--device", "rtx-5090",
                                       "--override", "nvidia_sm120.sparse_prefill_tuned:measure",
                                       "--all-checks", *SEED)[1]


def test_explain_json_is_the_decision() -> None:
    code, out = run("explain", "indexer_topk", "--device", "mi355x", "--json",
                    "-w", "k=2048,num_rows=64,max_keys=131072,dtype=float32")
    assert code == 0, out
    d = registry.Decision.model_validate_json(out)
    assert d.implementation == "amd_mi355x.indexer_topk_sliced"
    assert d.facts.profile == "mi355x"


def test_errors_are_one_clear_message_and_exit_nonzero() -> None:
    code, out = run("explain", "sparse_prefill", "--device", "rtx-9090", *SEED)
    assert code == 1 and "UnknownDeviceError" in out and "rtx-5090" in out
    code, out = run("explain", "sparse_prefill", "-w", "kind=chunk,topk=-3")
    assert code == 1 and "WorkloadError" in out and "topk" in out
    code, out = run("explain", "sparse_prefill", "-w", "kind")
    assert code == 2 and "is not FIELD=VALUE" in out
    code, out = run("explain", "sparse_prefill", "--device", "h200", "--set", "sm_count=many",
                    *SEED)
    assert code != 0 and "sm_count" in out
    assert "Traceback" not in out


def test_plugins_devices_profiles_ops() -> None:
    code, out = run("plugins")
    assert code == 0 and "nvidia_sm120  [loaded]" in out
    assert "impl nvidia_sm120.sparse_prefill_tuned (op sparse_prefill, priority 100)" in out
    code, out = run("profiles")
    assert code == 0 and all(n in out for n in registry.profiles())
    code, out = run("profiles", "--json")
    assert json.loads(out)["mi355x"] == {"source": "shipped",
                                         "facts": registry.profiles()["mi355x"].model_dump(
                                             mode="json")}
    code, out = run("ops")
    assert code == 0 and "group_size" in out and "impl amd_mi355x.indexer_topk_sliced" in out
    code, out = run("devices", "--json")
    assert code == 0 and json.loads(out)["vendor"] in ("cpu", "nvidia", "amd")
    code, out = run("plugins", "--json")
    assert {p["name"] for p in json.loads(out)} >= {"generic", "reference"}


def test_explain_on_a_profile_imports_neither_torch_nor_triton() -> None:
    code = ("import sys\nfrom click.testing import CliRunner\nimport cli\n"
            f"args = {['explain', 'sparse_prefill', '--device', 'gb10', *SEED]!r}\n"
            "r = CliRunner().invoke(cli.main, args)\n"
            "assert r.exit_code == 0, r.output\n"
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]\nassert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
