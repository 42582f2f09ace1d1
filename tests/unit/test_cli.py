"""The kreg command through click's CliRunner (and one real subprocess for import weight)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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


# --- device profiles, --set, and bad input ------------------------------------------------


def test_explain_a_profile_file_gives_the_same_decision(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    code, toml = run("profiles", "rtx-pro-6000-blackwell-server", "--toml")
    assert code == 0, toml
    path.write_text('profile = "rtx-pro-6000-blackwell-server"\n' + toml)
    by_name = json.loads(run("explain", "sparse_prefill", "--device",
                             "rtx-pro-6000-blackwell-server", *SEED, "--json")[1])
    code, out = run("explain", "sparse_prefill", "--device", str(path), *SEED, "--json")
    assert code == 0, out
    by_file = json.loads(out)
    assert {**by_file, "cached": None} == {**by_name, "cached": None}  # facts, candidates...
    other = tmp_path / "mybox.toml"
    other.write_text(toml)
    code, out = run("explain", "sparse_prefill", "--device", str(other), *SEED)
    assert code == 0, out
    assert out.splitlines()[0].startswith("sparse_prefill on mybox: NVIDIA RTX PRO 6000")
    assert "-> nvidia_sm120.sparse_prefill_tuned" in out


def test_explain_names_the_profile_it_used_after_set() -> None:
    code, out = run("explain", "sparse_prefill", "--device", "h200", "--set",
                    "compute_capability=10.0,name=NVIDIA B200", "--set", "extra.nvlink=5", *SEED)
    assert code == 0, out
    assert out.splitlines()[0].startswith(
        "sparse_prefill on h200 with compute_capability=10.0, name=NVIDIA B200, extra.nvlink=5: "
        "NVIDIA B200 (sm_90, 132 SMs")
    code, out = run("explain", "sparse_prefill", "--device", "h200", "--set",
                    "compute_capability=10,0", "--set", "profile=b200", *SEED, "--json")
    d = registry.Decision.model_validate_json(out)
    assert d.facts.compute_capability == (10, 0) and d.facts.profile == "b200"


def test_explain_what_if_reaches_every_field() -> None:
    code, out = run("explain", "sparse_prefill", "--device", "rtx-5090", "--set",
                    "name=NVIDIA RTX PRO 6000 Blackwell Server Edition", "--set", "sm_count=188",
                    *SEED)
    assert code == 0 and "-> nvidia_sm120.sparse_prefill_tuned" in out, out
    code, out = run("explain", "sparse_prefill", "--device", "rtx-pro-6000-blackwell-server",
                    "--set", "arch=sm_121", *SEED)
    assert "arch: sm_121, requires sm_120 [capability]" in out, out
    code, out = run("explain", "sparse_prefill", "--device", "rtx-pro-6000-blackwell-server",
                    "--set", "triton_version=none", *SEED)
    assert "triton not installed" in out, out


@pytest.mark.parametrize("args,message", [
    (["--set", "sm_counts=3"], "DeviceFacts has no field 'sm_counts'"),
    (["--set", "compute_capability=ten"], "compute_capability: expected MAJOR.MINOR such as 10.0"),
    (["--set", "compute_capability=10"], "compute_capability: expected MAJOR.MINOR"),
    (["--set", "triton_version=abc"], "triton_version: not a version"),
    (["--set", "sm_count=1", "--set", "sm_count=2"], "sm_count is given twice"),
    (["--device", "missing/b200.toml"], "no profile file missing/b200.toml: it does not exist"),
    (["--device", "rtx-9090"], "unknown device profile 'rtx-9090'"),
])
def test_bad_device_input_is_one_clear_error(args: list[str], message: str) -> None:
    code, out = run("explain", "sparse_prefill", *(["--device", "h200"] if "--device" not in args
                                                   else []), *args, *SEED)
    assert code == 1 and message in out, out
    assert "Traceback" not in out


def test_a_bad_profile_file_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "b200.toml"
    bad.write_text('vendor = "nvidia"\nname = "NVIDIA B200"\narch = "sm_100"\nsm = 148\n')
    code, out = run("explain", "sparse_prefill", "--device", str(bad), *SEED)
    assert code == 1 and "Traceback" not in out
    assert f"profile file {bad}:" in out and "sm: unknown field" in out
    assert "sm_count: missing (required)" in out and "kreg profiles h200 --toml" in out


def test_a_repeated_workload_field_is_an_error_naming_it() -> None:
    code, out = run("explain", "sparse_prefill", "--device", "h200", *SEED,
                    "-w", "total_q=4096")
    assert code == 2 and "field 'total_q' is given twice (8192 and 4096)" in out, out


def test_pid_needs_live_and_op_is_needed_without_live() -> None:
    code, out = run("explain", "sparse_prefill", "--pid", "12")
    assert code == 2 and "--pid selects the process" in out and "--live" in out
    code, out = run("explain", "--device", "h200")
    assert code == 2 and "missing OP" in out
    code, out = run("explain", "--live", "--device", "h200")
    assert code == 2 and "--device do not apply" in out


def test_live_without_op_shows_each_decision_with_its_workload(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from registry.daemon.server import journal_path_for

    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    sock = tmp_path / "kreg.sock"  # nothing answers: explain --live reads the journal
    monkeypatch.setenv("KREG_DAEMON", str(sock))
    journal = journal_path_for(sock)
    journal.parent.mkdir(parents=True)
    rec = {"t": 1.0, "pid": 7, "op": "sparse_prefill", "config": {"BLOCK_M": 16},
           "implementation": "generic.sparse_prefill_table", "reason": "highest", "hit": False,
           "device": "NVIDIA H200"}
    lines = [{**rec, "workload": "kind=prefill total_q=64"},
             {**rec, "workload": "kind=prefill total_q=8192"},
             {**rec, "op": "indexer_topk", "workload": "k=2048 num_rows=4"}]
    journal.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, out = run("explain", "--live")
    assert code == 0, out
    assert "workload" in out.splitlines()[1]
    assert "kind=prefill total_q=64 " in out and "kind=prefill total_q=8192" in out
    assert "k=2048 num_rows=4" in out
    code, out = run("explain", "sparse_prefill", "--live", "--json")
    assert [r["workload"] for r in json.loads(out)["decisions"]] == [
        "kind=prefill total_q=64", "kind=prefill total_q=8192"]


def test_strict_errors_print_the_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_STRICT", "1")
    registry.invalidate()
    code, out = run("explain", "sparse_prefill", "--device", "h200", "--set", "triton_version=none",
                    *SEED)
    assert code == 1, out
    assert "StrictModeError: KREG_STRICT=1: sparse_prefill would fall back to the torch " \
           "reference" in out
    assert "without KREG_STRICT=1 the decision would be:" in out
    assert "-> reference.sparse_prefill" in out and "candidate" in out
    assert "generic.sparse_prefill_table" in out and "triton not installed" in out
    code, out = run("explain", "sparse_prefill", "--device", "rtx-5090", "--override",
                    "nvidia_sm120.sparse_prefill_tuned", *SEED)
    assert code == 1 and "cannot be honoured" in out and "nvidia_sm120.sparse_prefill_tuned" \
        in out.split("decision would be:")[1], out


def test_profiles_lists_sources_and_prints_one(tmp_path: Path) -> None:
    code, out = run("profiles")
    assert code == 0
    assert any(line.split()[:2] == ["h200", "shipped"] for line in out.splitlines()), out
    code, toml = run("profiles", "h200", "--toml")
    assert "profile =" not in toml  # a copy is named by its file
    (tmp_path / "h200.toml").write_text(toml)
    assert registry.get_registry().resolve_device(str(tmp_path / "h200.toml")) == \
        registry.profiles()["h200"]
    code, out = run("profiles", str(tmp_path / "h200.toml"))
    assert code == 0 and out.startswith(f"profile h200 (file {tmp_path / 'h200.toml'})"), out
    code, out = run("profiles", "h200", "--json")
    assert registry.DeviceFacts.model_validate_json(out) == registry.profiles()["h200"]
    code, out = run("devices", "--toml")
    assert code == 0 and 'vendor = "' in out and "profile" not in out


def test_ops_names_each_ops_plugin_and_tools() -> None:
    code, out = run("ops")
    assert code == 0
    assert ("defined by plugin sparse_prefill; reference reference.sparse_prefill; kreg bench, "
            "kreg tune, conformance cases, custom op (registry.load_custom_ops())") in out
