"""sparse_prefill's config keys, validation and DENSE-tile parsing live in the pure-Python
``backends/sparse_prefill/config.py``: importing it, and computing the tuner's candidates,
loads no Triton; every name stays importable from ``triton_kernels`` as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from registry.errors import ConfigError

_PROBE = textwrap.dedent("""
    import sys
    import backends.sparse_prefill.config as c
    c.validate_config({"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3,
                       "DENSE": 250}, 6, 256)
    loaded = [m for m in sys.modules if m == "triton" or m.startswith("triton.")]
    assert not loaded, ("config", loaded)
    import registry
    from backends.sparse_prefill import tuning
    from backends.sparse_prefill.bench import BenchCase
    n = 0
    for kind in ("prefill", "chunk"):
        for dev in ("h200", "rtx-5090"):
            case = BenchCase(kind=kind, group_size=6, kv_len=8192, total_q=1024)
            case.extra["space"] = "small"
            cands = tuning.candidates(case, registry.profiles()[dev])
            n += sum(cfg is not None for _, cfg, _ in cands)
            assert any(cfg and cfg.get("UNION") for _, cfg, _ in cands), (kind, dev)
            # the exact-head tiles measured slower (session 43): not offered
            assert not [c for _, c, _ in cands if c and c.get("TILE_HEADS", "pow2") != "pow2"]
    assert n > 0
    loaded = [m for m in sys.modules if m == "triton" or m.startswith("triton.")]
    assert not loaded, ("candidates", loaded)
    print("ok", n)
""")


def test_config_and_tuner_candidates_load_no_triton():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("ok ")


def test_names_stay_importable_from_the_kernel_modules():
    pytest.importorskip("triton")
    from backends.sparse_prefill import config, gluon_kernels, triton_kernels

    for name in ("DEFAULT_VARIANT", "REQUIRED_KEYS", "validate_config", "_CHOICES",
                 "_GLUON_KEYS", "_MAX_HEAD_DIM", "_dense_tile_geometry", "_dense_heads",
                 "_variant", "_validate_gluon", "_is_pow2"):
        assert getattr(triton_kernels, name) is getattr(config, name), name
    assert gluon_kernels.GLUON_HEAD_DIMS is config.GLUON_HEAD_DIMS
    assert gluon_kernels.WGMMA_HEAD_DIM == config.WGMMA_HEAD_DIM == 256


def test_dense_tile_parsing_and_fixes_without_triton():
    from backends.sparse_prefill.config import _dense_heads, _dense_tile_geometry, validate_config

    assert _dense_tile_geometry("128x32x8x3", 6) == (128, 32, 8, 3)
    assert _dense_heads(6) == 8 and _dense_heads(12) == 16 and _dense_heads(3) == 4
    # the removed HP suffix (fewer heads a program): named, with its last commit and the fix
    with pytest.raises(ConfigError, match=r"HP suffix .* was removed \(issue 26; last in "
                                          r"commit [0-9a-f]{7}\).*use '64x32x4x2'"):
        _dense_tile_geometry("64x32x4x2x2", 6)
    for cfg in ({"DENSE": 250, "DENSE_TILE": "128x32x8x3x4"},
                {"UNION": 300, "DENSE_TILE": "64x32x4x2x0"}):
        with pytest.raises(ConfigError, match="HP suffix"):
            validate_config({"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 2, "num_stages": 3,
                             **cfg}, 6, 256)
    with pytest.raises(ConfigError, match="expected 'BMxBNxWxS'"):
        _dense_tile_geometry("64x32x4", 6)
    with pytest.raises(ConfigError, match="BM=16 must be a power of two >= 32"):
        _dense_tile_geometry("16x32x8x3", 20)   # a row's 20 heads pad to 32 lines
    # the fixes name the next power of two as triton.next_power_of_2 did
    with pytest.raises(ConfigError, match=r"use 16\)"):
        validate_config({"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}, 12, 64)
    with pytest.raises(ConfigError, match=r"use 32$"):
        validate_config({"BLOCK_M": 24, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}, 6, 64)
    with pytest.raises(ConfigError, match=r"use 32$"):
        validate_config({"BLOCK_M": 16, "BLOCK_N": 24, "num_warps": 4, "num_stages": 2}, 6, 64)


def test_tile_heads_group_rows_validation_and_explain():
    # TILE_HEADS="group": a row's lines are its group's heads exactly, RP = BM // group
    from backends.sparse_prefill.config import (
        _dense_heads,
        _dense_tile_geometry,
        _variant,
        describe_path,
        tile_rows,
        validate_config,
    )

    base = {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 2, "num_stages": 3}
    assert _dense_heads(6, "group") == 6 and _dense_heads(6, "pow2") == 8
    assert tile_rows(_variant({**base, "UNION": 300, "DENSE_TILE": "128x64x8x2"}), 6) == (8, 16)
    grp = _variant({**base, "UNION": 300, "DENSE_TILE": "128x64x8x2", "TILE_HEADS": "group"})
    assert tile_rows(grp, 6) == (6, 21) and tile_rows(grp, 12) == (12, 10)
    # DENSE's rows are DENSE_TILE's, the union's UNION_TILE's (one BM when both are on)
    both = _variant({**base, "DENSE": 250, "UNION": 300, "DENSE_TILE": "64x32x8x3",
                     "UNION_TILE": "64x64x8x2", "TILE_HEADS": "group"})
    assert tile_rows(both, 6, "DENSE") == tile_rows(both, 6, "UNION") == (6, 10)
    validate_config({**base, "UNION": 300, "TILE_HEADS": "group"}, 6, 256)
    # a group of 20 in 16 lines does not fit either way; in 32 it does with "group" only too
    with pytest.raises(ConfigError, match="BM=16 must be a power of two >= 20"):
        _dense_tile_geometry("16x32x8x3", 20, "DENSE_TILE", "group")
    assert _dense_tile_geometry("32x32x8x3", 20, "DENSE_TILE", "group") == (32, 32, 8, 3)
    with pytest.raises(ConfigError, match=r"TILE_HEADS='exact': expected one of "
                                          r"\('pow2', 'group'\)"):
        validate_config({**base, "UNION": 300, "TILE_HEADS": "exact"}, 6, 256)
    with pytest.raises(ConfigError, match=r"TILE_HEADS='group' shapes the DENSE and UNION row "
                                          r"tiles.*set DENSE or UNION, or drop TILE_HEADS"):
        validate_config({**base, "TILE_HEADS": "group"}, 6, 256)
    text = describe_path({**base, "UNION": 300, "TILE_HEADS": "group"})
    assert "tiles of the group's heads exactly, TILE_HEADS='group'" in text, text
    assert "TILE_HEADS" not in describe_path({**base, "UNION": 300})
