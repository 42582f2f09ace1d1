"""Fail when the kreg copy installed for a lent-machine call is not this tree's.

    python3 benchmarks/probes/check_installed.py /tmp/site

The lease scripts (device_run.sh, device_kernels.sh) install the carried wheel
``.whl/kreg-*.whl`` into SITE and put SITE first on ``PYTHONPATH`` (plugins load through
entry points, which only an installed copy has). A wheel built before the last edit then
shadows the tree: the call measures the old kernels under the new commit's name, and nothing
says so. This compares every module of kreg's packages (``backends``, ``registry``,
``plugins``, ``cli.py``) in SITE with the tree's and exits 2, naming the files that differ
and the command that rebuilds the wheel; 0 when they are the same.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PACKAGES = ("backends", "registry", "plugins")
REBUILD = "rm -f .whl/kreg-*.whl && .venv/bin/pip wheel --no-deps -w .whl ."


def _modules(root: Path) -> dict[str, str]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[path.relative_to(root).as_posix()] = \
                    hashlib.sha256(path.read_bytes()).hexdigest()
    if (root / "cli.py").is_file():
        found["cli.py"] = hashlib.sha256((root / "cli.py").read_bytes()).hexdigest()
    return found


def stale_files(site: Path, tree: Path) -> list[str]:
    """The kreg modules whose installed copy in ``site`` differs from ``tree``'s, is missing
    there, or exists only there (sorted)."""
    have, want = _modules(site), _modules(tree)
    return sorted(name for name in set(have) | set(want) if have.get(name) != want.get(name))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_installed.py SITE (the --target the carried wheels went to)",
              file=sys.stderr)
        return 2
    site, tree = Path(argv[0]), Path(__file__).resolve().parents[2]
    if not (site / "registry").is_dir():
        print(f"check_installed: no kreg in {site}: build the wheel here ({REBUILD}) and "
              f"carry .whl", file=sys.stderr)
        return 2
    stale = stale_files(site, tree)
    if stale:
        shown = ", ".join(stale[:8]) + (f" and {len(stale) - 8} more" if len(stale) > 8 else "")
        print(f"check_installed: the installed kreg in {site} is not this tree's ({len(stale)} "
              f"files differ: {shown}); it would shadow the tree on PYTHONPATH. Rebuild the "
              f"wheel before the call: {REBUILD}", file=sys.stderr)
        return 2
    print(f"check_installed: {site} holds this tree's kreg")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
