"""Device facts: what a kernel's eligibility depends on, probed once or taken from a profile.

Selection never probes: it receives a :class:`DeviceFacts`. :func:`probe` reads this machine
once per device index (without synchronizing the device); a *profile* describes a device nobody
here has, so every policy can be explained and tested anywhere.

Profiles are data: one file per device, TOML or JSON, holding DeviceFacts' fields by name (the
JSON of ``DeviceFacts.model_dump(mode="json")`` is a valid profile file; so is the TOML of
:meth:`DeviceFacts.to_toml`). The shipped ones are ``registry/profiles/*.toml``; the registry adds
those of ``KREG_PROFILES`` directories and of plugins' ``kreg_profiles`` hooks
(``Registry.profiles``). A profile's name is its ``profile`` field, else the file's name without
the suffix. docs/PLUGINS.md ("Device profiles") documents the schema.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from registry.errors import ConfigError
from registry.versions import parse_version

__all__ = ["PROFILE_SUFFIXES", "DeviceFacts", "load_profile", "looks_like_path", "probe",
           "probe_index", "profiles", "profiles_in"]

Vendor = Literal["nvidia", "amd", "cpu"]

#: The suffixes of profile files.
PROFILE_SUFFIXES = (".toml", ".json")

_VERSION_FIELDS = ("torch_version", "triton_version", "runtime_version")
_CAPABILITY = re.compile(r"^\s*[(\[]?\s*(\d+)\s*[.,]\s*(\d+)\s*[)\]]?\s*$")
_FIX = ("a profile holds DeviceFacts fields by name (docs/PLUGINS.md, \"Device profiles\"); "
        "`kreg profiles h200 --toml` prints one to start from")


class DeviceFacts(BaseModel):
    """The facts of one device and of the software that drives it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Bounded here, so that what a requirement or the tuning store reads is always usable: an
    # empty or 10 MB device name is refused at validation, never inside a plugin.
    vendor: Vendor
    name: str = Field(min_length=1, max_length=256)
    arch: str = Field(min_length=1, max_length=64,
                      description="sm_90, sm_120, gfx950, ... or cpu")
    compute_capability: tuple[int, int] | None = Field(
        default=None, description="(major, minor); in a profile or --set also \"10.0\"")
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

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _parse_capability(cls, value: Any) -> Any:
        """``"10.0"``, ``"10,0"``, ``"(10, 0)"`` or ``[10, 0]``: the spellings a profile file
        or ``--set`` may use."""
        if isinstance(value, str):
            if value.strip().lower() in ("", "none", "null"):
                return None
            m = _CAPABILITY.match(value)
            if m is None:
                raise ValueError("expected MAJOR.MINOR such as 10.0 (or 10,0 or [10, 0])")
            return (int(m.group(1)), int(m.group(2)))
        return value

    @field_validator("extra", mode="before")
    @classmethod
    def _extra_strings(cls, value: Any) -> Any:
        """Extra facts are strings; numbers and booleans (a TOML ``8`` or ``true``) are
        converted (``"8"``, ``"true"``)."""
        if isinstance(value, dict):
            return {k: (str(v).lower() if isinstance(v, bool) else
                        str(v) if isinstance(v, (int, float)) else v)
                    for k, v in value.items()}

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
            raise ConfigError(f"invalid device facts: {_problems(exc)}") from None

    def with_settings(self, settings: Iterable[str]) -> DeviceFacts:
        """A copy with ``FIELD=VALUE`` settings applied (the spelling of ``kreg explain --set``).

        Every field can be set: ``sm_count=148``, ``compute_capability=10.0`` (also ``10,0``
        or ``(10, 0)``), ``triton_version=3.7.1`` (a version must parse), ``name=NVIDIA B200``,
        ``none`` for an optional field, ``extra.KEY=VALUE`` for one extra fact (kept as a
        string), ``extra=`` to drop every extra fact, ``profile=NAME`` to name the result.
        Unless ``profile`` is set, the result's profile says what changed
        (``"h200 with compute_capability=10.0"``), so an explain of it never reads as the
        unchanged profile. Raises ConfigError naming an unknown field, a field set twice or a
        value that does not parse.
        """
        items = [s for s in settings if s.strip()]
        if not items:
            return self
        changes: dict[str, Any] = {}
        extra = dict(self.extra)
        seen: dict[str, str] = {}
        known = list(type(self).model_fields)
        for item in items:
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise ConfigError(f"--set {item!r} is not FIELD=VALUE (e.g. "
                                  f"compute_capability=10.0 or extra.KEY=VALUE)")
            if key in seen:
                raise ConfigError(f"--set {key} is given twice ({seen[key]!r} and {value!r}); "
                                  f"set each field once")
            seen[key] = value
            if key.startswith("extra."):
                name = key[len("extra."):]
                if not name:
                    raise ConfigError(f"--set {item!r}: name the extra fact, extra.KEY=VALUE")
                extra[name] = value
            elif key == "extra":
                if value:
                    raise ConfigError(f"--set {item!r}: set one extra fact with "
                                      f"extra.KEY=VALUE, or drop them all with extra=")
                extra = {}
            elif key not in known:
                raise ConfigError(f"--set {key}: DeviceFacts has no field {key!r}; known fields: "
                                  f"{', '.join(known)} (and extra.KEY)")
            else:
                changes[key] = None if value.lower() in ("none", "null") else value
        if extra != self.extra:
            changes["extra"] = extra
        data = self.model_dump()
        data.update(changes)
        try:
            out = DeviceFacts.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"--set: {_problems(exc)}") from None
        bad = _bad_versions(out, [k for k in changes if k in _VERSION_FIELDS])
        if bad:
            raise ConfigError(f"--set: {bad}")
        if "profile" in changes:
            return out
        shown = []
        for key in seen:
            now: Any = out.extra.get(key[6:]) if key.startswith("extra.") else (
                "" if key == "extra" else getattr(out, key))
            if isinstance(now, tuple):
                now = ".".join(map(str, now))
            shown.append(f"{key}={'none' if now is None else now}")
        return out.what_if(profile=f"{self.profile or 'this machine'} with {', '.join(shown)}")

    def to_toml(self) -> str:
        """These facts as a TOML profile file (``load_profile`` reads it back unchanged)."""
        lines = []
        for key, value in self.model_dump(mode="json").items():
            if key == "extra" or value is None:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        if self.extra:
            lines += ["", "[extra]"]
            lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in sorted(self.extra.items())]
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    # JSON strings, integers and arrays of integers are valid TOML.
    return json.dumps(value)


def _bad_versions(facts: DeviceFacts, fields: Iterable[str] = _VERSION_FIELDS) -> str:
    """The version fields of ``facts`` that do not parse, in words ('' when all do). Checked
    where facts are written as text (profile files, ``--set``): DeviceFacts built in code keep
    any string, and requirements treat an unparsable version as failing."""
    out = []
    for name in fields:
        value = getattr(facts, name)
        if value is not None:
            try:
                parse_version(value)
            except ValueError:
                out.append(f"{name}: not a version: expected release numbers such as 3.7.1, or "
                           f"none (got {value!r})")
    return "; ".join(out)


def _problems(exc: ValidationError) -> str:
    out = []
    for e in exc.errors():
        where = ".".join(map(str, e["loc"])) or "(the file)"
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown field; known fields: {', '.join(DeviceFacts.model_fields)}"
        elif e["type"] == "missing":
            msg = "missing (required)"
        got = "" if e["type"] in ("missing", "extra_forbidden") else f" (got {e['input']!r})"
        out.append(f"{where}: {msg}{got}")
    return "; ".join(out)


# id(facts) -> (facts, fingerprint): pydantic's private attributes are slow to read on the
# select hit path, so the digest is cached beside the object instead of inside it.
_FINGERPRINTS: dict[int, tuple[DeviceFacts, str]] = {}


# ---------------------------------------------------------------------------------------------
# profile files


class _Readable(Protocol):
    """A file: a ``pathlib.Path`` or an ``importlib.resources`` Traversable."""

    @property
    def name(self) -> str: ...

    def read_text(self, encoding: str | None = None) -> str: ...

    def is_dir(self) -> bool: ...

    def is_file(self) -> bool: ...

    def iterdir(self) -> Iterator[Any]: ...


def looks_like_path(text: str) -> bool:
    """Whether a ``--device`` value names a profile file rather than a profile: it contains a
    path separator or ends in ``.toml`` / ``.json``."""
    return "/" in text or os.sep in text or text.lower().endswith(PROFILE_SUFFIXES)


def _parse(text: str, suffix: str) -> Any:
    if suffix == ".json":
        return json.loads(text)
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


def load_profile(path: str | os.PathLike[str] | _Readable, *,
                 where: str | None = None) -> DeviceFacts:
    """The DeviceFacts of one profile file (``.toml`` or ``.json``), named by its ``profile``
    field, else by the file's name without the suffix.

    Raises ConfigError naming the file, the problem and the fix: a missing file, a suffix
    other than .toml/.json, a syntax error, an unknown or missing field, a value that does not
    validate.
    """
    file: Any = Path(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else path
    shown = where or str(path)
    suffix = Path(file.name).suffix.lower()
    if suffix not in PROFILE_SUFFIXES:
        raise ConfigError(f"profile file {shown}: a profile file ends in .toml or .json "
                          f"(got {suffix or 'no suffix'!r}); {_FIX}")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no profile file {shown}: it does not exist; pass the path of a "
                          f".toml or .json profile, or a profile name (`kreg profiles`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"profile file {shown} cannot be read: {exc}") from None
    try:
        data = _parse(text, suffix)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError
        raise ConfigError(f"profile file {shown} is not valid {suffix[1:].upper()}: {exc}; "
                          f"{_FIX}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"profile file {shown}: expected a table of DeviceFacts fields, got "
                          f"{type(data).__name__}; {_FIX}")
    name = data.get("profile") or Path(file.name).stem
    if not isinstance(name, str) or looks_like_path(name):
        raise ConfigError(f"profile file {shown}: profile {name!r} is not a profile name (no "
                          f"path separators, no .toml/.json suffix)")
    try:
        facts = DeviceFacts.model_validate({**data, "profile": name})
    except ValidationError as exc:
        raise ConfigError(f"profile file {shown}: {_problems(exc)}; {_FIX}") from None
    bad = _bad_versions(facts)
    if bad:
        raise ConfigError(f"profile file {shown}: {bad}; {_FIX}")
    return facts


def profiles_in(path: str | os.PathLike[str] | _Readable, *,
                where: str | None = None) -> list[tuple[DeviceFacts, str]]:
    """``[(facts, file)]`` of a profile file, or of every ``.toml`` / ``.json`` file of a
    directory (sorted by name; other files are ignored). Raises ConfigError for a path that
    does not exist and for a bad file (naming it)."""
    node: Any = Path(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else path
    shown = where or str(path)
    if node.is_dir():
        files = sorted((f for f in node.iterdir()
                        if f.is_file() and Path(f.name).suffix.lower() in PROFILE_SUFFIXES),
                       key=lambda f: f.name)
        return [(load_profile(f, where=f"{shown.rstrip('/')}/{f.name}"),
                 f"{shown.rstrip('/')}/{f.name}") for f in files]
    if not node.is_file():
        raise ConfigError(f"no profile file or directory {shown}: it does not exist")
    return [(load_profile(node, where=shown), shown)]


_SHIPPED: dict[str, DeviceFacts] | None = None


def profiles() -> dict[str, DeviceFacts]:
    """``{name: DeviceFacts}`` of the profiles shipped with kreg (``registry/profiles/``).

    ``registry.profiles()`` adds those of KREG_PROFILES and of plugins (``Registry.profiles``).
    """
    global _SHIPPED
    if _SHIPPED is None:
        from importlib.resources import files

        folder = files("registry") / "profiles"
        _SHIPPED = {f.profile: f for f, _ in profiles_in(folder, where="registry/profiles")
                    if f.profile}
    return dict(_SHIPPED)


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

