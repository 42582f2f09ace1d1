"""indexer_topk configs: keys, defaults, validation and launch plan (pure Python).

Kept apart from the Triton kernels so that policy (plugins) and selection can compute a config
without importing Triton. The keys are documented in ``triton_kernels``; the keys issue 25
removed (rejected by name) in :data:`REMOVED_KEYS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from registry.errors import ConfigError

__all__ = ["DEFAULT_CONFIG", "REMOVED_KEYS", "check_inputs", "default_config", "describe_path",
           "list_in_place", "plan", "resolve_config", "scratch_bytes_per_row", "validate_config"]

DEFAULT_CONFIG: dict[str, int] = {
    "SLICE_KEYS": 1024, "MAX_SLICES": 64, "num_warps": 4, "GROUP": 16, "GROUP_BLOCK": 64,
    "SEARCH_WARPS": 4, "BOUND_TILE": 4096, "CAND_TILE": 4096, "CAND_CAP": 16384,
    "FUSED": 0, "BOUND_SLACK": 256, "PLACE_KEYS": 2048, "GROUP2": 1,
    "COMPACT_TILE": 2048, "MAX_REGS": 0, "ROW_SPLIT": 1, "GMAX_BITS": 32, "ONE_PASS": 0,
}
# Keys removed by issue 25's clean-up (no policy, default, tuner or table selected their other
# values, and docs/notes/indexer_topk.md records those as losing or unmeasured; the knobs are
# at commit ea33f7d): what the kernels always do now, and the fix. A config naming one of them,
# at any value, is rejected, so that a stale config never silently means something else.
REMOVED_KEYS: dict[str, tuple[str, str]] = {
    "SEARCH_BITS": ("the searches halve (the former SEARCH_BITS=1, the default; the buffer "
                    "tier and the row tier keep their own four-way searches)", "drop the key"),
    "SPARSE": ("the four-launch placement reads only the groups whose maximum reaches the bound "
               "(the former SPARSE=1, the default)", "drop the key"),
    "BOUND_PASS": ("the four-launch bound pass runs exactly when a row has several slices (the "
                   "former BOUND_PASS=-1, the default)", "drop the key; pin MAX_SLICES=1 for "
                   "one slice a row"),
    "PDL": ("kernels launch plainly (the former PDL=0, the default)", "drop the key"),
    "GATHER_HALF": ("the fused gather reads half groups whole whenever max_keys is a multiple "
                    "of GROUP and masks every key otherwise (the former GATHER_HALF=1, the "
                    "default)", "drop the key"),
}
_POW2_KEYS = ("GROUP", "GROUP_BLOCK", "BOUND_TILE", "CAND_TILE", "CAND_CAP", "PLACE_KEYS",
              "GROUP2", "COMPACT_TILE")
_WARPS = (1, 2, 4, 8, 16, 32)
# Keys with a few allowed values: (values, what each means, the fix to name).
_CHOICES: dict[str, tuple[tuple[int, ...], str, str]] = {
    "FUSED": ((0, 1), "1 (two launches: group maxima, then programs a row) or 0 (four "
              "launches)", "use 1"),
    "ROW_SPLIT": ((1, 2, 4, 8), "1, 2, 4 or 8 (fused: programs a row)",
                  "use 1, or 2 when rows are fewer than half the device's SMs"),
    "GMAX_BITS": ((32, 16), "32 (exact group maxima) or 16 (fused: their top 16 bits, half the "
                  "traffic)", "use 32"),
    "ONE_PASS": ((0, 1), "0 (a gmax launch, then the row programs) or 1 (fused: each row "
                 "program reads its own row for the group maxima first, one launch)", "use 0"),
}


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_config(num_rows: int, max_keys: int, k: int = 2048, sm_count: int = 132,
                   fused: bool | None = None) -> dict[str, int]:
    """The default config for a workload shape, from the H200 measurements
    (docs/notes/indexer_topk.md, docs/BENCHMARKS.md): the four-launch path (``FUSED=0``) below
    32 rows, where many slice programs a row beat one row program's latency, with the bound in
    a launch of its own (16 x 131072: 42 us against 51 us fused); the fused two-launch path
    (``FUSED=1``) from 32 rows (54 us against 63 us). Fused row programs: 8 warps up to 256
    rows; above, 4 warps with 1024-value compaction and placement steps, so that at most 128
    registers a thread (``MAX_REGS``, both) fit four programs an SM (1024 x 131072: 392 us
    against 468 us without the cap and the smaller steps). ``fused`` forces the path.

    Fused: GROUP so that a row has about 8k groups and GROUP2 so that it has about 2k groups of
    GROUP * GROUP2 keys (the bound is searched over those, in a register tile of BOUND_TILE
    4096; the active groups are then the small groups reaching it: about 2,500 of 16,384 at
    131,072 random keys); enough gmax slices to give the device ~2 programs an SM (at most 64,
    at least 2048 keys a slice); 16-bit group maxima with one row program a row
    (:func:`_gmax_bits`). Four-launch: about 2k groups a row, as measured.
    """
    cfg = dict(DEFAULT_CONFIG)
    n = max(max_keys, 1)
    use_fused = num_rows >= 32 if fused is None else fused
    cfg["FUSED"] = int(use_fused)
    cfg["GROUP"] = max(2, min(256, _next_pow2(_cdiv(n, 8 * k))))
    want = max(1, _cdiv(2 * sm_count, max(num_rows, 1)))
    slices = min(64, want, max(1, n // 2048))
    # gmax: one slice a row (many rows) wants 4096-key steps at 4 warps; several slices a row
    # want steps up to 8192 keys at 8 warps (measured on the H200, docs/notes/indexer_topk.md).
    step = 4096 if slices == 1 else 8192
    cfg["num_warps"] = 4 if slices == 1 else 8
    if use_fused:
        # Fused gmax slices of at most 16384 keys, however many rows (H200, 131072 keys: 8
        # slices a row beat 5 at 64 rows and 1 at 1024 and 4096 rows by 3-4%).
        slices = min(64, max(slices, n // 16384))
        # Row programs: enough a row that they fill the device when rows are few.
        split = 1
        while split < 8 and num_rows * split * 2 <= sm_count:
            split *= 2
        cfg["ROW_SPLIT"] = split
        # ONE_PASS from ~30 rows an SM (4096 rows on the H200): no gmax launch, each row
        # program reads its own row for the maxima first. 4096 x 131072: 0.93-0.98x the
        # two-launch time on all ten distributions (randn 1175 against 1255 us); 2048 rows
        # 0.96-1.02x (ties and zeros 1-2% behind), 1024 rows 0.99-1.03x (session 23,
        # docs/notes/indexer_topk.md v45).
        cfg["ONE_PASS"] = int(num_rows >= 30 * sm_count)
    per_slice = _cdiv(n, slices)
    cfg["GROUP2"] = max(1, min(64, _next_pow2(_cdiv(n, 2 * k)) // cfg["GROUP"]))
    cfg["GROUP_BLOCK"] = max(cfg["GROUP2"], min(step, _next_pow2(per_slice)) // cfg["GROUP"])
    block = cfg["GROUP"] * cfg["GROUP_BLOCK"]
    cfg["SLICE_KEYS"] = max(block, _cdiv(per_slice, block) * block)
    cfg["BOUND_TILE"] = 4096
    few = num_rows <= 256
    cfg["SEARCH_WARPS"] = 8 if few else 4
    # 96 registers (five programs an SM) from 2048 rows: 4096 x 131072 1.279 ms against 1.326
    # at 128 (with session 5's gather 1.212 against 1.244, and 1.259 at 112); at 1024 rows 128
    # measured ahead then (357 us against 363) and 1% behind since (336 against 333: noise).
    cfg["MAX_REGS"] = 96 if num_rows >= 2048 else 128
    if use_fused and cfg["ROW_SPLIT"] > 1:
        # Split rows: at most one 8-warp program an SM, so the cap buys no occupancy; 168
        # (no spills since v47's double tile) ran 0.95-1.00x of 128 on all ten distributions
        # at 32 and 64 rows (H200, session 26; 0 / no cap: 1.00-1.07x, 192: up to 1.04x).
        cfg["MAX_REGS"] = 168
    # The bound's slack: k/8 groups, but k/32 for one row on the four-launch path (H100,
    # session 31, three windows against k/8: randn 1 row 0.94-0.95x (24.9-25.2 against 26.5
    # us), recent 0.93-0.96x, ramp 1.01-1.02x, the rest within 1%; at 2 rows inside the
    # noise, from 4 rows 1-4% behind: docs/notes/indexer_topk.md, "Session 31").
    one_row = num_rows == 1 and not use_fused
    cfg["BOUND_SLACK"] = max(1, k // 32 if one_row else k // 8)
    cfg["PLACE_KEYS"] = max(2048 if few else 1024, cfg["GROUP"])
    cfg["COMPACT_TILE"] = 2048 if few else 1024
    cfg["CAND_TILE"] = max(4096, _next_pow2(2 * k))
    cfg["CAND_CAP"] = max(16384, _next_pow2(8 * k))
    if use_fused and cfg["ROW_SPLIT"] > 1:
        # Each part of a split row gathers into its own CAND_CAP / ROW_SPLIT entries: room for
        # a double tile a part, so that a row whose candidates crowd into one part (`recent`:
        # ~4,200 in the last quarter) does not overflow it and leave the row to the tie
        # kernel's one program (32 rows, split 4, 4,096 a part: 2.9x randn's time, H200,
        # session 26). Split 2 keeps 16,384.
        cfg["CAND_CAP"] = max(cfg["CAND_CAP"], cfg["ROW_SPLIT"] * 2 * cfg["CAND_TILE"])
    if not use_fused:
        # The four-launch path's measured GROUP (about 2k groups a row) at the same keys per
        # step, its bound tile and 4 select warps.
        step_keys = cfg["GROUP"] * cfg["GROUP_BLOCK"]
        cfg["GROUP"] = max(16, min(256, _next_pow2(_cdiv(n, 2 * k))))
        cfg["GROUP_BLOCK"] = max(1, step_keys // cfg["GROUP"])
        cfg["BOUND_TILE"] = min(8192, max(1024, _next_pow2(_cdiv(n, cfg["GROUP"]))))
        cfg["SEARCH_WARPS"] = 4
    else:
        cfg["GMAX_BITS"] = _gmax_bits(cfg, n)
    return cfg


_TIERS = ("rows whose k-th key sits in a tie larger than the buffer, or whose candidates "
          "overflow it, finish in the rare tiers' launch")


def describe_path(config: Mapping[str, Any] | None) -> str:
    """Which launches a config makes, in words (``kreg explain``'s ``path:`` note). A config
    that leaves ``FUSED`` out (a vendor geometry such as the MI355X's slices) takes the
    default's path for the shape, which the kernel completes on the device."""
    if not config:
        return ("the default config for the shape (backends/indexer_topk/config.py "
                "default_config), completed on the device")
    cfg = {**DEFAULT_CONFIG, **config}
    if "FUSED" not in config:
        pinned = " ".join(f"{key}={config[key]}" for key in sorted(config))
        return (f"the default path for the shape (four launches below 32 rows, two from 32, "
                f"one from 30 rows an SM), completed on the device around {pinned}; {_TIERS}")
    slices = (f"group maxima of {cfg['GROUP']} keys ({cfg['GMAX_BITS']}-bit) in slices of "
              f"{cfg['SLICE_KEYS']} keys, at most {cfg['MAX_SLICES']} a row")
    if not cfg["FUSED"]:
        return (f"four launches: {slices}; the bound; the placement of the candidates; the "
                f"selection; {_TIERS}")
    if cfg["ONE_PASS"]:
        return (f"one launch (ONE_PASS=1), one program a row: its own row's group maxima of "
                f"{cfg['GROUP']} keys (32-bit) first, then the bound, the gather of the active "
                f"groups and the selection; {_TIERS}")
    split = cfg["ROW_SPLIT"]
    progs = "one row program a row" if split == 1 else f"{split} row programs a row"
    return (f"two launches: {slices}; then {progs} (the bound, the gather of the active "
            f"groups, the selection); {_TIERS}")


def _gmax_bits(cfg: dict[str, Any], max_keys: int) -> int:
    """32-bit group maxima by default (session 7, issue 25): 16-bit ones (the keys' top 16
    bits) were 2% faster on N(0, 1) rows (4096 x 131072: 1161 against 1188 us), but on rows
    equal in their top 16 bits every group becomes active and the gather reads the whole row
    (``lowbits``: 2.0x the random-row time at 1024 and 4096 rows, H200), and the tie tier
    needs exact maxima. ``GMAX_BITS=16`` stays selectable."""
    del cfg, max_keys
    return 32


def resolve_config(config: dict[str, Any], num_rows: int, max_keys: int,
                   k: int = 2048, sm_count: int = 132) -> dict[str, int]:
    """``config`` over :func:`default_config` for the shape on a device of ``sm_count`` SMs
    (CUs on AMD). A config that pins ``FUSED`` gets that path's defaults for the keys it
    leaves out."""
    fused = bool(config["FUSED"]) if config.get("FUSED") in (0, 1) else None
    one = config.get("ONE_PASS") == 1
    if one:
        fused = True
    base = default_config(num_rows, max_keys, k, sm_count, fused=fused)
    cfg = {**base, **config}
    if one:
        # ONE_PASS: one program a row, exact maxima (validate_config rejects a config
        # pinning anything else)
        cfg["ROW_SPLIT"] = config.get("ROW_SPLIT", 1)
        cfg["GMAX_BITS"] = config.get("GMAX_BITS", 32)
    elif "ONE_PASS" not in config and cfg.get("ONE_PASS") == 1 and (
            config.get("ROW_SPLIT", 1) != 1 or config.get("GMAX_BITS", 32) != 32):
        cfg["ONE_PASS"] = 0     # the default's ONE_PASS gives way to what the config pinned
    if "GROUP_BLOCK" not in config and isinstance(cfg["GROUP2"], int):
        cfg["GROUP_BLOCK"] = max(cfg["GROUP_BLOCK"], cfg["GROUP2"])   # whole supergroups a step
    if "GMAX_BITS" not in config and cfg["FUSED"] == 1 and all(
            isinstance(cfg[key], int) and cfg[key] > 0 for key in ("ROW_SPLIT", "GROUP")):
        # The default's rule again for what the config pinned (ROW_SPLIT, GROUP).
        cfg["GMAX_BITS"] = _gmax_bits(cfg, max_keys)
    return cfg


def validate_config(config: dict[str, Any], k: int, max_keys: int) -> None:
    """Raise :class:`ConfigError` naming the key, the rule and the fix."""
    if not isinstance(config, dict):
        raise ConfigError(f"indexer_topk config must be a dict of ints; got "
                          f"{type(config).__name__}; pass e.g. {DEFAULT_CONFIG}")
    removed = [key for key in REMOVED_KEYS if key in config]
    if removed:
        key = removed[0]
        now, fix = REMOVED_KEYS[key]
        raise ConfigError(f"indexer_topk config key {key} (={config[key]!r}) was removed (issue "
                          f"25; last in commit ea33f7d): {now}; {fix}")
    unknown = sorted(set(config) - set(DEFAULT_CONFIG))
    if unknown:
        raise ConfigError(f"indexer_topk config has unknown key(s) {unknown}; known keys: "
                          f"{sorted(DEFAULT_CONFIG)}; remove them")
    cfg = {**DEFAULT_CONFIG, **config}
    for key, val in cfg.items():
        if not isinstance(val, int) or isinstance(val, bool):
            raise ConfigError(f"indexer_topk config {key}={val!r}: must be an int; "
                              f"use e.g. {DEFAULT_CONFIG[key]}")
    for key in _POW2_KEYS:
        if not _pow2(cfg[key]):
            raise ConfigError(f"indexer_topk config {key}={cfg[key]}: must be a power of two; "
                              f"use {_next_pow2(cfg[key])}")
    for key in ("num_warps", "SEARCH_WARPS"):
        if cfg[key] not in _WARPS:
            raise ConfigError(f"indexer_topk config {key}={cfg[key]}: must be one of {_WARPS}; "
                              "use 4 or 8")
    for key, (allowed, meaning, fix) in _CHOICES.items():
        if cfg[key] not in allowed:
            raise ConfigError(f"indexer_topk config {key}={cfg[key]}: must be {meaning}; {fix}")
    if not 2 <= cfg["GROUP"] <= 256:
        raise ConfigError(f"indexer_topk config GROUP={cfg['GROUP']}: must be in [2, 256]; "
                          "use 16 (or max_keys / 8192 for very long rows)")
    if cfg["GROUP"] * cfg["GROUP_BLOCK"] > 65536:
        raise ConfigError(f"indexer_topk config GROUP*GROUP_BLOCK="
                          f"{cfg['GROUP'] * cfg['GROUP_BLOCK']}: must be <= 65536 keys per "
                          "inner step; lower GROUP_BLOCK")
    if cfg["SLICE_KEYS"] < 1:
        raise ConfigError(f"indexer_topk config SLICE_KEYS={cfg['SLICE_KEYS']}: must be >= 1; "
                          "use 1024")
    if not 1 <= cfg["MAX_SLICES"] <= 1024:
        raise ConfigError(f"indexer_topk config MAX_SLICES={cfg['MAX_SLICES']}: must be in "
                          "[1, 1024]; use 64")
    if cfg["CAND_CAP"] < k:
        raise ConfigError(f"indexer_topk config CAND_CAP={cfg['CAND_CAP']}: must be >= k ({k}); "
                          f"use {max(16384, _next_pow2(8 * k))}")
    if cfg["CAND_TILE"] > cfg["CAND_CAP"]:
        raise ConfigError(f"indexer_topk config CAND_TILE={cfg['CAND_TILE']}: must be <= "
                          f"CAND_CAP ({cfg['CAND_CAP']}); lower CAND_TILE or raise CAND_CAP")
    if max(cfg["CAND_TILE"], cfg["BOUND_TILE"], cfg["COMPACT_TILE"]) > 65536:
        raise ConfigError("indexer_topk config CAND_TILE, BOUND_TILE and COMPACT_TILE: must be "
                          "<= 65536 (register tiles); lower them")
    if cfg["BOUND_SLACK"] < 0:
        raise ConfigError(f"indexer_topk config BOUND_SLACK={cfg['BOUND_SLACK']}: must be >= 0 "
                          "(extra groups the FUSED bound search may leave); use k // 8")
    if cfg["PLACE_KEYS"] < cfg["GROUP"] or cfg["PLACE_KEYS"] > 65536:
        raise ConfigError(f"indexer_topk config PLACE_KEYS={cfg['PLACE_KEYS']}: must be in "
                          f"[GROUP ({cfg['GROUP']}), 65536]; use 2048")
    if cfg["GROUP2"] > 64 or (cfg["FUSED"] and cfg["GROUP2"] > cfg["GROUP_BLOCK"]):
        raise ConfigError(f"indexer_topk config GROUP2={cfg['GROUP2']}: must be <= 64 and <= "
                          f"GROUP_BLOCK ({cfg['GROUP_BLOCK']}); use 4")
    if cfg["MAX_REGS"] != 0 and not 32 <= cfg["MAX_REGS"] <= 255:
        raise ConfigError(f"indexer_topk config MAX_REGS={cfg['MAX_REGS']}: must be 0 (the "
                          "compiler's choice) or a register cap per thread in [32, 255] for the "
                          "row program; use 0 or 128")
    clash = {key: config[key] for key, want in (("FUSED", 1), ("ROW_SPLIT", 1), ("GMAX_BITS", 32))
             if key in config and config[key] != want}
    if cfg["ONE_PASS"] and clash:
        raise ConfigError(f"indexer_topk config ONE_PASS=1 (one row program a row reading its "
                          f"own row) needs FUSED=1, ROW_SPLIT=1 and GMAX_BITS=32; got "
                          f"{clash}; drop those keys or use ONE_PASS=0")
    if max_keys < 0:
        raise ConfigError(f"indexer_topk max_keys={max_keys}: must be >= 0")


def plan(config: dict[str, Any], max_keys: int) -> dict[str, int]:
    """Resolved launch geometry: slices, slice_len, groups, block."""
    cfg = {**DEFAULT_CONFIG, **config}
    block = cfg["GROUP"] * cfg["GROUP_BLOCK"]
    n = max(int(max_keys), 1)
    s0 = max(1, min(cfg["MAX_SLICES"], _cdiv(n, cfg["SLICE_KEYS"])))
    slice_len = _cdiv(_cdiv(n, s0), block) * block
    slices = _cdiv(n, slice_len)
    groups = _cdiv(n, cfg["GROUP"])
    return {"slices": slices, "slice_len": slice_len, "groups": groups, "block": block}


# uint16 list entries: group indices below this (tests lower it to run the other layout small).
LIST16_GROUPS = 65536


def list_in_place(config: dict[str, Any], max_keys: int) -> bool:
    """Fused path: whether the row program writes its active-group list over the row's group
    maxima (read already) instead of into an area of its own. Not with several programs a row
    (another may still be reading them for its bound); with 16-bit maxima, only as uint16
    entries, so for rows of at most 65536 groups."""
    cfg = {**DEFAULT_CONFIG, **config}
    if cfg["ROW_SPLIT"] > 1:
        return False
    return cfg["GMAX_BITS"] != 16 or _cdiv(max(int(max_keys), 1), cfg["GROUP"]) <= LIST16_GROUPS


#: The minima the gmax kernel keeps for the tie kernel's minimum bound (the fused path's
#: supergroups, the four-launch path's groups) for rows of at most this many: they are searched
#: in one register tile.
MIN_TILE = 4096


def min_bound_tile(config: dict[str, Any], max_keys: int) -> int:
    """The register tile of the tie kernel's minimum bound for ``config`` (resolved) at
    ``max_keys``, or 0 where the kernels keep no minima. Fused: the minima of the supergroups
    (``GROUP * GROUP2`` keys; none with 16-bit maxima or without supergroups); four-launch: of
    the groups (``GROUP`` keys). None with more of them than :data:`MIN_TILE`."""
    cfg = {**DEFAULT_CONFIG, **config}
    if cfg["FUSED"]:
        if cfg["GROUP2"] <= 1 or cfg["GMAX_BITS"] == 16:
            return 0
        n = _cdiv(max(int(max_keys), 1), cfg["GROUP"] * cfg["GROUP2"])
    else:
        n = _cdiv(max(int(max_keys), 1), cfg["GROUP"])
    if n > MIN_TILE:
        return 0
    return 1 << max(0, n - 1).bit_length()


def scratch_bytes_per_row(config: dict[str, Any], k: int, max_keys: int) -> int:
    """Bytes of workspace a row for ``config`` (resolved, e.g. by :func:`resolve_config`) at
    ``max_keys`` keys: what the wrapper allocates per call, divided by the rows. ``k`` is
    unused (kept for the callers' signature)."""
    cfg = {**DEFAULT_CONFIG, **config}
    p = plan(cfg, max_keys)
    if cfg["FUSED"]:
        groups2 = _cdiv(max(int(max_keys), 1), cfg["GROUP"] * cfg["GROUP2"])
        split = cfg["ROW_SPLIT"]
        b16 = cfg["GMAX_BITS"] == 16
        return int((2 if b16 else 4) * p["groups"] + (4 * groups2 if cfg["GROUP2"] > 1 else 0)
                   + 8 * cfg["CAND_CAP"] + (4 * (split + 1) if split > 1 else 0)
                   + (0 if list_in_place(cfg, max_keys) else 4 * p["groups"])
                   + (4 * groups2 if min_bound_tile(cfg, max_keys) else 0))
    # The list area (the tie tier's) is allocated on every call; the group minima where
    # min_bound_tile says.
    return int(8 * p["groups"] + 8 * cfg["CAND_CAP"] + 4 * (p["slices"] + 2)
               + (4 * p["groups"] if min_bound_tile(cfg, max_keys) else 0))


def check_inputs(scores: Any, lengths: Any, k: Any, *, kernel: bool = False) -> None:
    """The op's input rules (``backends.indexer_topk``, "Inputs"), shared by every
    implementation: shapes, dtypes and devices of a call, never a device read or a sync; the
    ``lengths`` values (each in ``[0, max_keys]``) only where they are in host memory (a CPU
    tensor), where reading them costs no synchronization.

    ``kernel`` adds what the Triton kernels need beyond the op's rules: int32 positions with
    room to spare.
    """
    import torch

    from registry.errors import WorkloadError

    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise WorkloadError(f"indexer_topk: scores must be a 2-D tensor [rows, max_keys]; got "
                            f"{getattr(scores, 'shape', type(scores).__name__)}")
    if scores.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise WorkloadError(f"indexer_topk: scores dtype must be float32, bfloat16 or float16; "
                            f"got {scores.dtype}; cast the scores first")
    if scores.shape[1] > 1 and scores.stride(1) != 1:  # every implementation: one rule
        raise WorkloadError("indexer_topk: scores must have unit stride along keys; "
                            "pass scores.contiguous()")
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 \
            or lengths.shape[0] != scores.shape[0]:
        raise WorkloadError(f"indexer_topk: lengths must be a 1-D tensor of {scores.shape[0]} "
                            f"entries; got {getattr(lengths, 'shape', type(lengths).__name__)}")
    if lengths.dtype != torch.int32:
        raise WorkloadError(f"indexer_topk: lengths must be int32; got {lengths.dtype}; "
                            "use lengths.to(torch.int32)")
    if lengths.device != scores.device:
        raise WorkloadError(f"indexer_topk: lengths is on {lengths.device} but scores on "
                            f"{scores.device}; move both to one device")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise WorkloadError(f"indexer_topk: k must be a positive int; got {k!r}")
    if kernel and scores.shape[1] >= 2 ** 31 - 65536:
        raise WorkloadError(f"indexer_topk: max_keys {scores.shape[1]} too large; must be "
                            "< 2**31 - 65536 (int32 positions)")
    if lengths.device.type == "cpu" and lengths.numel():
        lo, hi = (int(x) for x in torch.aminmax(lengths))
        if hi > scores.shape[1]:
            raise WorkloadError(f"indexer_topk: lengths must be <= max_keys ({scores.shape[1]}); "
                                f"got max {hi}; clamp lengths or widen scores")
        if lo < 0:
            raise WorkloadError(f"indexer_topk: lengths must be >= 0 (valid leading keys of "
                                f"each row); got {lo} at row {int(torch.argmin(lengths))}; use "
                                f"0 for a row with no valid key")
