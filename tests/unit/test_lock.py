"""Decision lockfiles (issue #28): ``kreg lock``, ``kreg verify``, ``kreg lock --diff`` and
``KREG_LOCK``, on the seed's sm120 decisions over its total_q sweep, CPU only (device profiles).

CI-style: lock five devices, verify passes, and each of Triton 3.6 on the Server profile, a
disabled plugin, a winning tuning entry and an override in force makes it fail with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import cli
import registry
from registry.errors import ConfigError, KregError
from registry.lock import LockDriftError, LockPinError, load_lock
from registry.tuning import TuningEntry, TuningStore, identity_of

from unit_helpers import seed_workload

SERVER = "rtx-pro-6000-blackwell-server"
DEVICES = [SERVER, "rtx-5090", "gb10", "h200", "mi355x"]
TUNED = "nvidia_sm120.sparse_prefill_tuned"
TABLE = "generic.sparse_prefill_table"
# The seed's sweep (tests/unit/test_sm120_policy.py): its three TP rank shapes, chunk prefill of
# one request, total_q across the 512-row threshold up to the 8,192 rows it was measured at.
SHAPES = [(6, 1), (12, 1), (12, 2)]
TOTAL_Q = [32, 64, 128, 256, 511, 512, 1024, 2048, 8192]
ROOT = Path(__file__).resolve().parents[2]


def sweep() -> list[dict[str, Any]]:
    return [{"op": "sparse_prefill", **seed_workload(group_size=g, num_kv_heads=kv, total_q=tq,
                                                     max_q=tq)}
            for g, kv in SHAPES for tq in TOTAL_Q]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty KREG_HOME (no tuning entries, no journal), the sweep written as JSON lines, and
    cwd in tmp_path; the default registry is rebuilt afterwards (KREG_LOCK is read at build)."""
    monkeypatch.setenv("KREG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep.jsonl").write_text("".join(json.dumps(w) + "\n" for w in sweep()))
    registry.reset_registry()
    yield tmp_path
    monkeypatch.delenv("KREG_LOCK", raising=False)
    monkeypatch.delenv("KREG_LOCK_MODE", raising=False)
    monkeypatch.delenv("KREG_HOME", raising=False)
    registry.reset_registry()


def kreg(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exc_info
    return result.exit_code, result.output


def lock(out: str = "seed.lock", *extra: str, devices: list[str] = DEVICES) -> Path:
    code, text = kreg("lock", "sparse_prefill", *[a for d in devices for a in ("--device", d)],
                      "--workloads", "sweep.jsonl", "-o", out, *extra)
    assert code == 0, text
    return Path(out)


def verify_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli.main, ["verify", *args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def winning_entry(total_q: int = 8192) -> TuningEntry:
    """A measured config for the Server profile at one point of the sweep (group 6)."""
    device, software = identity_of(registry.profiles()[SERVER])
    bucket = {k: v for k, v in seed_workload(total_q=total_q, max_q=total_q).items()}
    return TuningEntry(op="sparse_prefill", family=TUNED, device=device, software=software,
                       bucket=bucket, config={"BLOCK_M": 8, "BLOCK_N": 32, "num_warps": 4,
                                              "num_stages": 2},
                       timings_ms={"8x32x4x2": 0.9, "8x16x4x3": 1.0}, command="test")


# ---------------------------------------------------------------------------------------------
# kreg lock / kreg verify


def test_lock_the_seed_and_verify_passes(home: Path) -> None:
    path = lock()
    doc = load_lock(path)
    assert doc.schema_version == 1 and doc.format == "kreg-lock"
    assert sorted(doc.devices) == sorted(DEVICES)
    assert len(doc.entries) == len(DEVICES) * len(SHAPES) * len(TOTAL_Q)
    by = {(e.device, e.workload["group_size"], e.workload["num_kv_heads"],
           e.workload["total_q"]): e for e in doc.entries}
    tuned = by[(SERVER, 6, 1, 8192)]
    assert tuned.implementation == TUNED and tuned.plugin == "nvidia_sm120"
    assert tuned.config == {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 4, "num_stages": 3}
    assert tuned.priority == 100
    assert {c.name for c in tuned.checks} >= {"arch", "triton", "device", "rank_shape"}
    assert all(c.passed for c in tuned.checks)
    triton = next(c for c in tuned.checks if c.name == "triton")
    assert (triton.kind, triton.observed, triton.required) == ("capability", "3.7.1", ">= 3.7")
    assert tuned.software.triton == "3.7.1"
    assert tuned.facts_fingerprint == registry.profiles()[SERVER].fingerprint
    assert tuned.plugins["nvidia_sm120"] == doc.plugins["nvidia_sm120"].version
    assert doc.plugins["nvidia_sm120"].distribution == "kreg"
    # what outranked it and why not: the measured plugin (no entry), the Hopper family (arch)
    assert [c.implementation for c in tuned.passed_over] == [
        "measured.sparse_prefill", "nvidia_hopper.sparse_prefill_tuned"]
    assert by[(SERVER, 6, 1, 511)].implementation == TABLE
    assert by[(SERVER, 12, 2, 512)].config == {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2,
                                               "num_stages": 3}
    for device in ("rtx-5090", "gb10", "mi355x"):
        assert {e.implementation for e in doc.entries if e.device == device} == {TABLE}
    gb10 = by[("gb10", 6, 1, 8192)]
    sm120 = next(c for c in gb10.passed_over if c.implementation == TUNED)
    assert [str(c) for c in sm120.failed] == [
        "arch: sm_121, requires sm_120",
        "device: NVIDIA GB10 (48 SMs), requires one of {NVIDIA RTX PRO 6000 Blackwell Server "
        "Edition (188 SMs)}"]
    assert {e.implementation for e in doc.entries if e.device == "h200"} <= {
        TABLE, "nvidia_hopper.sparse_prefill_tuned"}

    code, out = kreg("verify", str(path))
    assert code == 0, out
    assert "135 locked decisions on 5 devices: no decision changed" in out
    code, report = verify_json(str(path))
    assert code == 0 and report["ok"] is True and report["drifts"] == []


def test_lockfile_is_byte_identical_across_runs_cwd_and_home(home: Path, tmp_path: Path) -> None:
    first = lock("one.lock").read_bytes()
    assert lock("two.lock").read_bytes() == first
    # the same inputs given in another order: the same bytes
    code, _ = kreg("lock", "sparse_prefill", *[a for d in reversed(DEVICES)
                                               for a in ("--device", d)],
                   "--workloads", "sweep.jsonl", "-o", "three.lock")
    assert code == 0 and Path("three.lock").read_bytes() == first
    # another process, cwd and HOME (so another default KREG_HOME), an absolute path
    other = tmp_path / "elsewhere"
    (other / "home").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREG_")}
    env["HOME"] = str(other / "home")
    subprocess.run([sys.executable, "-c", "import cli; cli.main()", "lock", "sparse_prefill",
                    *[a for d in DEVICES for a in ("--device", d)],
                    "--workloads", str(home / "sweep.jsonl"), "-o", "four.lock"],
                   cwd=other, env=env, check=True, capture_output=True, timeout=120)
    assert (other / "four.lock").read_bytes() == first
    text = first.decode()
    assert str(tmp_path) not in text and "measured_at" not in text
    assert json.loads(text)["digest"].startswith("sha256:")


def test_triton_36_on_the_server_fails_verify_with_the_check_that_flipped(home: Path) -> None:
    path = lock()
    code, report = verify_json(str(path), "--set", "triton_version=3.6.0")
    assert code == 1 and report["ok"] is False
    drifts = report["drifts"]
    # every tuned Server decision (4 row counts >= 512 x 3 rank shapes), nothing elsewhere
    assert len(drifts) == 12 and {d["device"] for d in drifts} == {SERVER}
    for d in drifts:
        assert d["before"]["implementation"] == TUNED
        assert d["after"]["implementation"] == TABLE
        kinds = {r["kind"]: r for r in d["reasons"]}
        assert kinds["fact"]["subject"] == "triton_version"
        assert (kinds["fact"]["before"], kinds["fact"]["after"]) == ("3.7.1", "3.6.0")
        flip = kinds["check"]
        assert flip["subject"] == f"{TUNED}/triton" and flip["check_kind"] == "capability"
        assert (flip["before"], flip["after"]) == ("3.7.1", "3.6.0")
    code, out = kreg("verify", str(path), "--device", SERVER, "--set", "triton_version=3.6.0")
    assert code == 1
    assert "27 locked decisions on 1 device: 12 changed (108 of other devices not checked)" in out
    assert "fact triton_version: 3.7.1 -> 3.6.0 (--set)" in out
    assert (f"{TUNED}: check triton [capability] passed -> failed: 3.7.1 -> 3.6.0, requires "
            ">= 3.7") in out
    assert f"locked  {TUNED}  config: BLOCK_M=8 BLOCK_N=16 num_warps=4 num_stages=3" in out
    assert f"now     {TABLE}  config:" in out


def test_a_disabled_plugin_fails_verify_naming_it(home: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = lock()
    monkeypatch.setenv("KREG_DISABLE_PLUGINS", "nvidia_sm120")  # read by the fresh registry
    code, report = verify_json(str(path))
    assert code == 1
    drifts = report["drifts"]
    assert len(drifts) == 12 and {d["device"] for d in drifts} == {SERVER}
    texts = [r["text"] for r in drifts[0]["reasons"]]
    assert ("plugin nvidia_sm120: loaded (kreg 0.1.0) when locked, now skipped (in "
            "KREG_DISABLE_PLUGINS)") in texts
    assert f"{TUNED} (locked; plugin nvidia_sm120) is not registered now" in texts
    # the plugin set changed for every device: said once, where no decision moved too
    assert any(r["subject"] == "nvidia_sm120" for r in report["changes"]["*"])


def test_a_disabled_plugin_in_a_subprocess(home: Path) -> None:
    path = lock(devices=[SERVER])
    env = {**os.environ, "KREG_DISABLE_PLUGINS": "nvidia_sm120"}
    run = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "verify", str(path)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "now skipped (in KREG_DISABLE_PLUGINS)" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr


def test_a_winning_tuning_entry_fails_verify_with_the_check_that_flipped(home: Path) -> None:
    path = lock()
    TuningStore().put([winning_entry()])
    code, report = verify_json(str(path))
    assert code == 1
    [d] = report["drifts"]  # the one point measured; the floor rule serves nothing below it
    assert d["device"] == SERVER and d["workload"]["total_q"] == 8192
    assert d["workload"]["group_size"] == 6
    assert d["after"] == {"implementation": "measured.sparse_prefill",
                          "config": {"BLOCK_M": 8, "BLOCK_N": 32, "num_warps": 4,
                                     "num_stages": 2},
                          "reason": "highest priority (200) of 4 eligible; all 4 checks passed"}
    [flip] = d["reasons"]
    assert flip["subject"] == "measured.sparse_prefill/tuning_entry"
    assert flip["check_kind"] == "capability"
    assert flip["before"] == "none for this device and workload shape"
    assert flip["after"] == "1 entries for this device and software"


def test_an_override_in_force_fails_verify_naming_it(home: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = lock()
    monkeypatch.setenv("KREG_SELECT_SPARSE_PREFILL", TABLE)
    code, out = kreg("verify", str(path), "--device", SERVER)
    assert code == 1
    assert "27 locked decisions on 1 device: 12 changed" in out
    assert f"override in force: KREG_SELECT_SPARSE_PREFILL={TABLE} (honoured)" in out
    assert f"because override {TABLE}" in out
    # :measure on the 5090 moves the 5090's rows-qualified decisions to the tuned family
    monkeypatch.setenv("KREG_SELECT_SPARSE_PREFILL", TUNED + ":measure")
    code, report = verify_json(str(path), "--device", "rtx-5090")
    assert code == 1
    texts = {r["text"] for d in report["drifts"] for r in d["reasons"]}
    assert (f"override in force: KREG_SELECT_SPARSE_PREFILL={TUNED}:measure (honoured)") in texts
    assert any("check device [envelope] failed -> waived (:measure)" in t for t in texts)


def test_lock_diff_prints_what_an_upgrade_changes_device_by_device(home: Path) -> None:
    old = lock("old.lock")
    TuningStore().put([winning_entry()])
    new = lock("new.lock")
    code, out = kreg("lock", "--diff", str(old), str(new))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "old.lock -> new.lock: 135 locked decisions on 5 devices: 1 changed"
    assert f"{SERVER}:" in lines
    assert f"    old  {TUNED}  config: BLOCK_M=8 BLOCK_N=16 num_warps=4 num_stages=3" in lines
    assert ("    why  measured.sparse_prefill: check tuning_entry [capability] failed -> passed: "
            "none for this device and workload shape -> 1 entries for this device and "
            "software") in lines
    code, same = kreg("verify", str(old), str(new))
    assert code == 1 and same == out
    assert kreg("lock", "--diff", str(old), str(old))[0] == 0
    # a lock of fewer devices: the others' entries are "only in old"
    small = lock("small.lock", devices=[SERVER])
    code, out = kreg("lock", "--diff", str(new), str(small), "--json")
    report = json.loads(out)
    statuses = [d["status"] for d in report["drifts"]]
    assert code == 1 and statuses.count("removed") == 4 * 27 and statuses.count("changed") == 0


def test_grid_and_journal_workloads(home: Path) -> None:
    base = {"op": "sparse_prefill", **seed_workload()}
    Path("one.jsonl").write_text("# the seed's shape\n\n" + json.dumps(base) + "\n")
    code, out = kreg("lock", "sparse_prefill", "--device", SERVER, "--workloads", "one.jsonl",
                     "--grid", "total_q,max_q=256,512", "--grid", "group_size=6,12", "-o",
                     "grid.lock")
    assert code == 0, out
    doc = load_lock("grid.lock")
    got = [(e.workload["group_size"], e.workload["total_q"], e.workload["max_q"],
            e.implementation) for e in doc.entries]
    assert got == [(6, 256, 256, TABLE), (6, 512, 512, TUNED), (12, 256, 256, TABLE),
                   (12, 512, 512, TUNED)]
    journal = home / "home" / "journal"
    journal.mkdir(parents=True)
    wl = registry.get_registry().workload("sparse_prefill", seed_workload(total_q=1024,
                                                                          max_q=1024))
    records = [{"op": "sparse_prefill", "workload": wl.short(), "device": "x"},
               {"op": "indexer_topk", "workload": "k=2048", "device": "x"},
               {"op": "sparse_prefill", "workload": "kind=chunk topk=oops", "device": "x"}]
    (journal / "decisions-abc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out = kreg("lock", "sparse_prefill", "--device", SERVER, "--from-journal", "-o",
                     "journal.lock")
    assert code == 0, out
    assert "1 journal records (1 no longer valid, skipped)" in out
    [entry] = load_lock("journal.lock").entries
    assert entry.workload["total_q"] == 1024 and entry.implementation == TUNED


def test_this_machine_when_no_device_is_given(home: Path) -> None:
    code, out = kreg("lock", "sparse_prefill", "--workloads", "sweep.jsonl", "-o", "here.lock")
    assert code == 0, out
    doc = load_lock("here.lock")
    assert list(doc.devices) == ["local"] and doc.devices["local"].source == "local"
    assert kreg("verify", "here.lock")[0] == 0


# ---------------------------------------------------------------------------------------------
# bad input: one message naming the problem and the fix, never a traceback


@pytest.mark.parametrize("args,expect", [
    (["nope", "--workloads", "sweep.jsonl"], "UnknownOpError: unknown op 'nope'; known ops:"),
    (["sparse_prefill", "--device", "rtx-9090", "--workloads", "sweep.jsonl"],
     "unknown device profile 'rtx-9090'; known profiles: gb10,"),
    (["sparse_prefill", "--workloads", "missing.jsonl"],
     "workloads file missing.jsonl: no such file; pass --workloads FILE, a JSON-lines file"),
    (["sparse_prefill", "--workloads", "bad.jsonl"],
     "bad.jsonl:2: not valid JSON (Expecting ',' delimiter at column"),
    (["sparse_prefill", "--workloads", "badop.jsonl"], "badop.jsonl:1: unknown op 'nope'"),
    (["sparse_prefill", "--workloads", "noop.jsonl"], 'noop.jsonl:1: no "op" key; each line'),
    (["sparse_prefill", "--workloads", "badwl.jsonl"],
     "badwl.jsonl:1: WorkloadError: invalid sparse_prefill workload: head_dim"),
    (["sparse_prefill"], "give the workloads: --workloads FILE"),
    ([], "give the ops to lock"),
    (["sparse_prefill", "--workloads", "sweep.jsonl", "--grid", "foo=1"],
     "foo is not a workload field of sparse_prefill"),
    (["sparse_prefill", "--device", "h200", "--workloads", "sweep.jsonl", "--set",
      "sm_count=many"], "--set: sm_count: Input should be a valid integer"),
    (["sparse_prefill", "--workloads", "sweep.jsonl", "-o", "nodir/x.lock"],
     "cannot write lockfile nodir/x.lock"),
])
def test_bad_lock_input_is_one_clear_message(home: Path, args: list[str], expect: str) -> None:
    seed = json.dumps({"op": "sparse_prefill", **seed_workload()})
    Path("bad.jsonl").write_text(seed + "\n" + '{"op": "sparse_prefill", "kind": "chunk"\n')
    Path("badop.jsonl").write_text('{"op": "nope"}\n')
    Path("noop.jsonl").write_text('{"kind": "chunk"}\n')
    Path("badwl.jsonl").write_text('{"op": "sparse_prefill", "kind": "chunk", "topk": 2051}\n')
    code, out = kreg("lock", *args)
    assert code == 2, out
    assert expect in out
    assert "Traceback" not in out


def test_bad_lockfiles_are_a_config_error_naming_the_file_and_the_fix(home: Path) -> None:
    good = lock(devices=[SERVER]).read_text()
    doc = json.loads(good)
    Path("corrupt.lock").write_text(good[:100])
    Path("other.lock").write_text(json.dumps({**doc, "schema_version": 99}))
    doc["entries"][0]["config"] = {"BLOCK_M": 1}
    Path("edited.lock").write_text(json.dumps(doc))
    Path("foreign.lock").write_text("{}")
    cases = {"missing.lock": "no such file; write one with `kreg lock",
             "corrupt.lock": "not JSON",
             "other.lock": "schema_version 99, but this kreg reads schema_version 1; re-create",
             "edited.lock": "digest mismatch",
             "foreign.lock": "not a kreg lockfile"}
    for name, expect in cases.items():
        code, out = kreg("verify", name)
        assert code == 2 and f"ConfigError: lockfile {name}: " in out and expect in out, out
        assert "Traceback" not in out
    code, out = kreg("verify", "seed.lock", "--device", "h100")
    assert code == 2 and "device 'h100' is not in lockfile seed.lock (it locks: " in out


# ---------------------------------------------------------------------------------------------
# KREG_LOCK


def test_pin_serves_the_locked_config_after_a_winning_tuning_entry(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = lock()
    TuningStore().put([winning_entry()])
    registry.reset_registry()
    wl = seed_workload()
    assert registry.select("sparse_prefill", wl, SERVER).implementation == \
        "measured.sparse_prefill"  # what an unlocked process now runs
    monkeypatch.setenv("KREG_LOCK", str(path))
    monkeypatch.setenv("KREG_LOCK_MODE", "pin")
    registry.reset_registry()
    d = registry.select("sparse_prefill", wl, SERVER)
    assert d.implementation == TUNED
    assert d.config == {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 4, "num_stages": 3}
    assert d.reason.startswith(f"pinned by KREG_LOCK={path} (lock entry ")
    assert "selection would pick measured.sparse_prefill BLOCK_M=8 BLOCK_N=32" in d.reason
    assert d.chosen.config == d.config
    assert "-> nvidia_sm120.sparse_prefill_tuned" in d.explain()
    # keys the lock agrees with, and keys it does not hold, are decided as usual
    assert registry.select("sparse_prefill", seed_workload(total_q=1024, max_q=1024),
                           SERVER).reason.startswith("highest priority (100)")
    unlocked = registry.select("sparse_prefill", seed_workload(total_q=4096, max_q=4096), SERVER)
    assert unlocked.implementation == TUNED and unlocked.notes == []


def test_verify_mode_logs_a_drift_once_and_raises_under_strict(
        home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    path = lock()
    TuningStore().put([winning_entry()])
    monkeypatch.setenv("KREG_LOCK", str(path))
    registry.reset_registry()
    with caplog.at_level(logging.WARNING, logger="registry.lock"):
        for _ in range(2):
            d = registry.select("sparse_prefill", seed_workload(), SERVER)
            registry.invalidate()  # a new miss: still logged once
    assert d.implementation == "measured.sparse_prefill"  # verify mode changes nothing
    assert any("KREG_LOCK: differs from lock entry" in n for n in d.notes)
    drifts = [r for r in caplog.records if r.name == "registry.lock"]
    assert len(drifts) == 1
    assert "check tuning_entry [capability] failed -> passed" in drifts[0].getMessage()
    monkeypatch.setenv("KREG_STRICT", "1")
    registry.invalidate()
    with pytest.raises(LockDriftError) as exc:
        registry.select("sparse_prefill", seed_workload(), SERVER)
    msg = str(exc.value)
    assert isinstance(exc.value, KregError)
    assert f"KREG_LOCK={path} (verify)" in msg and "(lock entry " in msg
    assert f"is locked to {TUNED} BLOCK_M=8 BLOCK_N=16 num_warps=4 num_stages=3" in msg
    assert "fix: see `kreg verify" in msg and "KREG_LOCK_MODE=pin" in msg


def test_pin_refuses_a_missing_or_incapable_locked_implementation(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = lock(devices=[SERVER])
    monkeypatch.setenv("KREG_LOCK", str(path))
    monkeypatch.setenv("KREG_LOCK_MODE", "pin")
    monkeypatch.setenv("KREG_DISABLE_PLUGINS", "nvidia_sm120")
    registry.reset_registry()
    with pytest.raises(LockPinError, match=f"is locked to {TUNED}, which is not registered now "
                                           r"\(plugin nvidia_sm120: skipped \(in "
                                           r"KREG_DISABLE_PLUGINS\)\); fix: install or enable"):
        registry.select("sparse_prefill", seed_workload(), SERVER)
    monkeypatch.delenv("KREG_DISABLE_PLUGINS")
    registry.reset_registry()
    # the same hardware with Triton 3.6: a capability check fails, and is never waived
    facts = registry.profiles()[SERVER].what_if(triton_version="3.6.0")
    with pytest.raises(LockPinError, match=r"which cannot run here: triton: 3.6.0, requires "
                                           r">= 3.7 \[capability\]"):
        registry.select("sparse_prefill", seed_workload(), facts)


def test_pin_waives_the_locked_implementations_envelope(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Locked while measuring the 5090 (:measure waived the device set); served so without it.
    monkeypatch.setenv("KREG_SELECT_SPARSE_PREFILL", TUNED + ":measure")
    path = lock(devices=["rtx-5090"])
    entry = next(e for e in load_lock(path).entries if e.workload["total_q"] == 8192)
    assert entry.implementation == TUNED and entry.override is not None
    monkeypatch.delenv("KREG_SELECT_SPARSE_PREFILL")
    monkeypatch.setenv("KREG_LOCK", str(path))
    monkeypatch.setenv("KREG_LOCK_MODE", "pin")
    registry.reset_registry()
    d = registry.select("sparse_prefill", seed_workload(), "rtx-5090")
    assert d.implementation == TUNED and "(envelope waived: device)" in d.reason
    assert [c.name for c in d.chosen.checks if c.waived] == ["device"]


def test_an_honoured_override_wins_over_a_pin(home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = lock(devices=[SERVER])
    monkeypatch.setenv("KREG_LOCK", str(path))
    monkeypatch.setenv("KREG_LOCK_MODE", "pin")
    monkeypatch.setenv("KREG_SELECT_SPARSE_PREFILL", TABLE)
    registry.reset_registry()
    d = registry.select("sparse_prefill", seed_workload(), SERVER)
    assert d.implementation == TABLE
    assert any("differs from lock entry" in n for n in d.notes)


@pytest.mark.parametrize("content,expect", [
    (None, "no such file"), ("{", "not JSON"),
    ('{"format": "kreg-lock", "schema_version": 7}', "schema_version 7"),
])
def test_a_bad_kreg_lock_is_a_config_error_at_registry_creation(
        home: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, expect: str) -> None:
    path = home / "bad.lock"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("KREG_LOCK", str(path))
    with pytest.raises(ConfigError) as exc:
        registry.reset_registry()
    assert f"KREG_LOCK={path}: lockfile {path}: {expect}" in str(exc.value).replace("\n", " ")
    assert "or unset KREG_LOCK" in str(exc.value)


def test_a_bad_kreg_lock_is_one_message_from_any_command(home: Path) -> None:
    env = {**os.environ, "KREG_LOCK": "missing.lock"}
    run = subprocess.run([sys.executable, "-c", "import cli; cli.main()", "explain",
                          "sparse_prefill", "--device", SERVER, "-w",
                          ",".join(f"{k}={v}" for k, v in seed_workload().items())],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "Error: ConfigError: KREG_LOCK=missing.lock: lockfile missing.lock: no such file; "
        "write one with `kreg lock OP... --device PROFILE... --workloads FILE -o "
        "missing.lock`; or unset KREG_LOCK")


def test_a_bad_lock_mode_is_a_config_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KREG_LOCK", str(lock(devices=[SERVER])))
    monkeypatch.setenv("KREG_LOCK_MODE", "pinned")
    with pytest.raises(ConfigError, match="Unable to use KREG_LOCK_MODE='pinned': expected "
                                          "verify"):
        registry.reset_registry()


def test_the_hook_runs_on_misses_only(home: Path) -> None:
    reg = registry.Registry()
    calls: list[str] = []

    def hook(r: registry.Registry, d: registry.Decision) -> registry.Decision:
        calls.append(d.implementation)
        return d

    reg.lock = hook
    for _ in range(3):
        reg.select("sparse_prefill", seed_workload(), SERVER)
    assert calls == [TUNED]
    assert registry.Registry().lock is None  # a bare registry has no lockfile


def test_a_device_from_a_facts_file(home: Path) -> None:
    facts = registry.profiles()[SERVER].what_if(profile="our-server")
    Path("our-server.json").write_text(facts.model_dump_json())
    code, out = kreg("lock", "sparse_prefill", "--device", "our-server.json", "--workloads",
                     "sweep.jsonl", "-o", "file.lock")
    assert code == 0, out
    doc = load_lock("file.lock")
    assert list(doc.devices) == ["our-server"] and doc.devices["our-server"].source == "file"
    assert kreg("verify", "file.lock")[0] == 0  # on its locked facts
    Path("our-server.json").write_text(facts.what_if(triton_version="3.6.0").model_dump_json())
    code, out = kreg("verify", "file.lock", "--device", "our-server.json")
    assert code == 1 and "fact triton_version: 3.7.1 -> 3.6.0" in out
    Path("broken.json").write_text("{}")
    code, out = kreg("lock", "sparse_prefill", "--device", "broken.json", "--workloads",
                     "sweep.jsonl")
    assert code == 2 and "profile file broken.json: vendor: missing (required)" in out


def test_lock_takes_devices_and_what_ifs_as_explain_does(home: Path) -> None:
    """A TOML profile file and explain's --set spellings (compute_capability=10.0, extra.KEY)
    work in lock and verify: one device resolver and one what-if parser for every command."""
    Path("b200.toml").write_text(registry.profiles()[SERVER].what_if(profile="b200").to_toml())
    code, out = kreg("lock", "sparse_prefill", "--device", "b200.toml", "--set",
                     "compute_capability=10.0", "--set", "extra.fw=7", "--workloads",
                     "sweep.jsonl", "-o", "b200.lock")
    assert code == 0, out
    doc = load_lock("b200.lock")
    dev = doc.devices["b200"]
    assert dev.source == "file" and dev.facts["compute_capability"] == [10, 0]
    assert dev.facts["extra"] == {"fw": "7"}
    assert kreg("verify", "b200.lock", "--device", "b200.toml")[0] == 0
