"""Device facts: what a kernel's eligibility depends on, probed once or taken from a profile.

Selection never probes: it receives a :class:`DeviceFacts`. :func:`probe` reads this machine
once per device index (without synchronizing the device) and :func:`profiles` returns the shipped
profiles of devices nobody here has, so every policy can be explained and tested anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from registry.errors import ConfigError

__all__ = ["DeviceFacts", "probe", "probe_index", "profiles"]

Vendor = Literal["nvidia", "amd", "cpu"]


class DeviceFacts(BaseModel):
    """The facts of one device and of the software that drives it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Bounded here, so that what a requirement or the tuning store reads is always usable: an
    # empty or 10 MB device name is refused at validation, never inside a plugin.
    vendor: Vendor
    name: str = Field(min_length=1, max_length=256)
    arch: str = Field(min_length=1, max_length=64,
                      description="sm_90, sm_120, gfx950, ... or cpu")
    compute_capability: tuple[int, int] | None = None
    sm_count: int = Field(ge=0, le=2**31 - 1,
                          description="multiprocessors (SMs on NVIDIA, CUs on AMD)")
    memory_bytes: int = Field(ge=0, le=2**63 - 1)
    torch_version: str | None = Field(default=None, max_length=128)
    triton_version: str | None = Field(default=None, max_length=128)
    runtime_version: str | None = Field(default=None, max_length=128,
                                        description="CUDA or HIP version")
    profile: str | None = Field(default=None, max_length=256,
                                description="the profile these facts came from")
    extra: dict[str, str] = Field(default_factory=dict,
                                  description="facts added by vendor plugins and the probe")

    @field_validator("compute_capability")
    @classmethod
    def _small_capability(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not all(0 <= v <= 1000 for v in value):
            raise ValueError(f"{value} is not a (major, minor) compute capability")
        return value

    @field_validator("extra")
    @classmethod
    def _bounded_extra(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 64:
            raise ValueError(f"{len(value)} extra facts; at most 64")
        for k, v in value.items():
            if not 1 <= len(k) <= 128 or len(v) > 1024:
                raise ValueError(f"extra fact {k[:40]!r}: keys have 1 to 128 characters, "
                                 f"values at most 1024")
        return value

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __eq__(self, other: object) -> bool:
        # Field values only: the cached fingerprint is not part of the identity.
        if not isinstance(other, DeviceFacts):
            return NotImplemented
        return self.__dict__ == other.__dict__

    @property
    def fingerprint(self) -> str:
        """A short digest of every field: equal facts give equal fingerprints."""
        fp = _FINGERPRINTS.get(id(self))
        if fp is None or fp[0] is not self:
            digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]
            if len(_FINGERPRINTS) > 1024:
                _FINGERPRINTS.clear()
            # The entry holds the object, so its id cannot be reused while cached.
            _FINGERPRINTS[id(self)] = fp = (self, digest)
        return fp[1]

    def describe(self) -> str:
        """One line: 'NVIDIA H200 (sm_90, 132 SMs; torch 2.11.0, triton 3.6.0, cuda 13.0)'."""
        unit = "CUs" if self.vendor == "amd" else ("cores" if self.vendor == "cpu" else "SMs")
        runtime = {"nvidia": "cuda", "amd": "hip"}.get(self.vendor, "runtime")
        sw = [f"torch {self.torch_version or '-'}", f"triton {self.triton_version or '-'}"]
        if self.vendor != "cpu":
            sw.append(f"{runtime} {self.runtime_version or '-'}")
        return f"{self.name} ({self.arch}, {self.sm_count} {unit}; {', '.join(sw)})"

    def what_if(self, **changes: Any) -> DeviceFacts:
        """A copy with some fields changed (validated), for what-if explains."""
        unknown = set(changes) - set(type(self).model_fields)
        if unknown:
            raise ConfigError(
                f"DeviceFacts has no field {sorted(unknown)}; known fields: "
                f"{', '.join(type(self).model_fields)}")
        data = self.model_dump()
        data.update(changes)
        try:
            return DeviceFacts.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']} "
                                 f"(got {str(repr(e['input']))[:80]})" for e in exc.errors())
            raise ConfigError(f"invalid device facts: {problems}") from None


# id(facts) -> (facts, fingerprint): pydantic's private attributes are slow to read on the
# select hit path, so the digest is cached beside the object instead of inside it.
_FINGERPRINTS: dict[int, tuple[DeviceFacts, str]] = {}

_GB = 1024**3

_PROFILE_DATA: dict[str, dict[str, Any]] = {
    # Software versions: what each part typically runs today; change them with what_if().
    "rtx-pro-6000-blackwell-server": dict(
        vendor="nvidia", name="NVIDIA RTX PRO 6000 Blackwell Server Edition", arch="sm_120",
        compute_capability=(12, 0), sm_count=188, memory_bytes=96 * _GB,
        torch_version="2.13.0+cu130", triton_version="3.7.1", runtime_version="13.0"),
    "rtx-pro-6000-blackwell-workstation": dict(
        vendor="nvidia", name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", arch="sm_120",
        compute_capability=(12, 0), sm_count=188, memory_bytes=96 * _GB,
        torch_version="2.13.0+cu130", triton_version="3.7.1", runtime_version="13.0"),
    "rtx-5090": dict(
        vendor="nvidia", name="NVIDIA GeForce RTX 5090", arch="sm_120",
        compute_capability=(12, 0), sm_count=170, memory_bytes=32 * _GB,
        torch_version="2.13.0+cu130", triton_version="3.7.1", runtime_version="13.0"),
    "gb10": dict(
        vendor="nvidia", name="NVIDIA GB10", arch="sm_121",
        compute_capability=(12, 1), sm_count=48, memory_bytes=128 * _GB,
        torch_version="2.13.0+cu130", triton_version="3.7.1", runtime_version="13.0"),
    "h200": dict(
        vendor="nvidia", name="NVIDIA H200", arch="sm_90",
        compute_capability=(9, 0), sm_count=132, memory_bytes=143771 * 1024**2,
        torch_version="2.11.0+cu130", triton_version="3.6.0", runtime_version="13.0"),
    "h100": dict(
        vendor="nvidia", name="NVIDIA H100 80GB HBM3", arch="sm_90",
        compute_capability=(9, 0), sm_count=132, memory_bytes=80 * _GB,
        torch_version="2.11.0+cu130", triton_version="3.6.0", runtime_version="13.0"),
    "h20": dict(
        vendor="nvidia", name="NVIDIA H20", arch="sm_90",
        compute_capability=(9, 0), sm_count=78, memory_bytes=96 * _GB,
        torch_version="2.11.0+cu130", triton_version="3.6.0", runtime_version="13.0"),
    "l20": dict(
        vendor="nvidia", name="NVIDIA L20", arch="sm_89",
        compute_capability=(8, 9), sm_count=92, memory_bytes=48 * _GB,
        torch_version="2.11.0+cu130", triton_version="3.6.0", runtime_version="13.0"),
    "mi355x": dict(
        vendor="amd", name="AMD Instinct MI355X", arch="gfx950",
        compute_capability=(9, 5), sm_count=256, memory_bytes=288 * _GB,
        torch_version="2.10.0+rocm7.2", triton_version="3.6.0", runtime_version="7.2"),
    "mi300x": dict(
        vendor="amd", name="AMD Instinct MI300X", arch="gfx942",
        compute_capability=(9, 4), sm_count=304, memory_bytes=192 * _GB,
        torch_version="2.10.0+rocm7.2", triton_version="3.6.0", runtime_version="7.2"),
}

_PROFILES: dict[str, DeviceFacts] | None = None


def profiles() -> dict[str, DeviceFacts]:
    """``{name: DeviceFacts}`` of the shipped device profiles."""
    global _PROFILES
    if _PROFILES is None:
        _PROFILES = {name: DeviceFacts(profile=name, **data)
                     for name, data in _PROFILE_DATA.items()}
    return dict(_PROFILES)


def _package_version(name: str) -> str | None:
    # Reads installed metadata only: probing must not import Triton (slow, and it may init CUDA).
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


_probe_lock = threading.Lock()
_probed: dict[int, DeviceFacts] = {}


def _probe_uncached(index: int, torch: Any) -> DeviceFacts:
    triton_version = _package_version("triton") or _package_version("pytorch-triton-rocm")
    torch_version = str(torch.__version__)
    extra: dict[str, str] = {}
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        extra["triton_interpret"] = "1"
    if index < 0 or not torch.cuda.is_available():
        mem = 0
        with contextlib.suppress(ValueError, OSError, AttributeError):
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return DeviceFacts(vendor="cpu", name=platform.processor() or platform.machine() or "cpu",
                           arch="cpu", compute_capability=None, sm_count=os.cpu_count() or 1,
                           memory_bytes=mem, torch_version=torch_version,
                           triton_version=triton_version, runtime_version=None, extra=extra)
    props = torch.cuda.get_device_properties(index)
    hip = getattr(torch.version, "hip", None)
    if hip:
        gcn = str(getattr(props, "gcnArchName", "") or "")
        arch = gcn.split(":")[0] or f"gfx{props.major}{props.minor}"
        return DeviceFacts(vendor="amd", name=str(props.name), arch=arch,
                           compute_capability=(int(props.major), int(props.minor)),
                           sm_count=int(props.multi_processor_count),
                           memory_bytes=int(props.total_memory), torch_version=torch_version,
                           triton_version=triton_version, runtime_version=str(hip), extra=extra)
    return DeviceFacts(vendor="nvidia", name=str(props.name), arch=f"sm_{props.major}{props.minor}",
                       compute_capability=(int(props.major), int(props.minor)),
                       sm_count=int(props.multi_processor_count),
                       memory_bytes=int(props.total_memory), torch_version=torch_version,
                       triton_version=triton_version,
                       runtime_version=str(getattr(torch.version, "cuda", None) or "") or None,
                       extra=extra)


def probe_index(index: int) -> DeviceFacts:
    """Facts of device ``index`` (``-1``: the CPU), read once per index."""
    facts = _probed.get(index)
    if facts is not None:
        return facts
    import torch  # only here: selection on given facts never imports torch

    with _probe_lock:
        facts = _probed.get(index)
        if facts is None:
            facts = _probe_uncached(index, torch)
            _probed[index] = facts
    return facts


def probe(index: int | None = None) -> DeviceFacts:
    """DeviceFacts of a device of this machine, read once per device index.

    ``index=None`` means torch's current device when a GPU is present, else the CPU; ``-1`` means
    the CPU. Reads device properties only (name, capability, multiprocessor count, memory,
    ``gcnArchName`` on ROCm) and package metadata: it never synchronizes the device and never
    imports Triton. Vendor plugins' ``kreg_enrich_facts`` are applied by ``registry.probe``.
    """
    if index is None:
        import torch

        index = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return probe_index(index)


def _clear_probe_cache() -> None:
    _probed.clear()

