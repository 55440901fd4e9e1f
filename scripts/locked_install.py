"""Installs packages at the versions of gwdet's lock, each file checked against the lock's sha256
hashes (pip's hash-checking mode). Used by scripts/setup_env.sh; runs with the environment's own
python, standard library only.

    python scripts/locked_install.py LOCK [--unpinned NAME ...] -- PIP_INSTALL_ARGUMENTS
    python scripts/locked_install.py LOCK --exact NAME [NAME ...] -- PIP_INSTALL_ARGUMENTS

Resolving (the first form): pip may install only pinned, hash-checked requirements in hash-checking
mode, every dependency included, so a step is done in two passes:

1. ``pip install --dry-run --report`` of the arguments (e.g. ``torch torchvision`` or
   ``-e .[lab]``), constrained to the lock's versions: what pip would install, dependencies
   included, leaving alone what is installed at the locked version already;
2. ``pip install --no-deps --require-hashes`` of exactly those packages, from the lock's lines:
   each downloaded file must have one of the lock's hashes.

A local project in the arguments (``-e .``) is left to the caller (pip cannot hash a folder). A
package the plan needs and the lock does not hold stops the step with the command that regenerates
the lock. ``--unpinned NAME`` leaves NAME out of the constraints (the set-up keeps a user's own
torch and torchvision that way, and the Pillow < 10 that detectron2 v0.6 needs).

Exact (the second form): the lock's lines for NAME, installed with ``--no-deps --require-hashes``
and the given arguments (the registry's detectron2 wheel: ``--target DIR --python-version 3.10``).

A pip older than 22.2 (no ``--dry-run --report``, e.g. Ubuntu 22.04's 22.0) is first brought to the
lock's pip, hash-checked the same way.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REGENERATE = "scripts/update_lock.sh (docs/install.md, \"The lock\")"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def log(message: str) -> None:
    print(f"[setup] {message}", flush=True)


def canonical(name: str) -> str:
    """A distribution name as the package index compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Pin:
    """One line of the lock: ``name==version [; marker]`` with its hashes."""

    name: str
    version: str
    marker: str
    hashes: list[str] = field(default_factory=list)

    def constraint(self) -> str:
        return f"{self.name}=={self.version}" + (f" ; {self.marker}" if self.marker else "")

    def hashed(self) -> str:
        return " ".join([f"{self.name}=={self.version}", *(f"--hash={digest}" for digest in self.hashes)])


PIN_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)\s*(?:;\s*(?P<marker>.*?))?\s*$")


def read_lock(path: Path) -> list[Pin]:
    """The lock's pins (a requirements file as uv and pip-tools write it: ``name==version ; marker``
    with ``--hash`` options on continuation lines, comments on lines of their own)."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    pins = []
    for line in logical:
        requirement, _, _ = line.partition(" --hash=")
        match = PIN_LINE.match(requirement.strip())
        if match is None:
            raise SystemExit(f"{path}: not a pinned requirement (name==version): {line!r}; regenerate the lock with "
                             f"{REGENERATE}")
        pins.append(Pin(canonical(match["name"]), match["version"], match["marker"] or "",
                        re.findall(r"--hash=(\S+)", line)))
    return pins


def pip_version() -> tuple[int, ...]:
    done = subprocess.run([*PIP, "--version"], capture_output=True, text=True, check=True)
    return tuple(int(part) for part in re.findall(r"\d+", done.stdout.split()[1])[:2])


def install_exact(pins: list[Pin], names: list[str], pip_arguments: list[str], lock: Path) -> None:
    """The lock's lines for ``names``, installed with --no-deps --require-hashes."""
    chosen = []
    for name in map(canonical, names):
        found = [pin for pin in pins if pin.name == name]
        if len(found) != 1:
            raise SystemExit(f"[setup] error: {lock} holds {len(found)} lines for {name} (one expected); regenerate "
                             f"it with {REGENERATE}")
        chosen.extend(found)
    install_hashed(chosen, pip_arguments, lock)


def install_hashed(chosen: list[Pin], pip_arguments: list[str], lock: Path) -> None:
    missing = [pin.name for pin in chosen if not pin.hashes]
    if missing:
        raise SystemExit(f"[setup] error: {lock} has no hash for {', '.join(missing)}; regenerate it with {REGENERATE}")
    with tempfile.TemporaryDirectory() as folder:
        requirements = Path(folder, "hashed.txt")
        requirements.write_text("".join(pin.hashed() + "\n" for pin in chosen), encoding="utf-8")
        log(f"installing from {lock.name}, each file checked against its sha256: "
            + ", ".join(f"{pin.name}=={pin.version}" for pin in chosen))
        subprocess.run([*PIP, "install", "-q", "--no-deps", "--require-hashes", "-r", str(requirements),
                        *pip_arguments], check=True)


def install_resolved(pins: list[Pin], unpinned: set[str], pip_arguments: list[str], lock: Path) -> None:
    """Pass 1: what pip would install under the lock's versions; pass 2: exactly that, hash-checked."""
    with tempfile.TemporaryDirectory() as folder:
        constraints = Path(folder, "constraints.txt")
        constraints.write_text("".join(pin.constraint() + "\n" for pin in pins if pin.name not in unpinned),
                               encoding="utf-8")
        report = Path(folder, "report.json")
        subprocess.run([*PIP, "install", "-q", "--dry-run", "--report", str(report), "-c", str(constraints),
                        *pip_arguments], check=True)
        planned = json.loads(report.read_text(encoding="utf-8"))["install"]
    chosen, absent = [], []
    for item in planned:
        if item.get("is_direct"):  # a local project (gwdet itself) or a URL the caller gave: the caller's
            continue
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        found = [pin for pin in pins if pin.name == name and pin.version == version]
        if found:
            chosen.append(found[0])
        else:
            absent.append(f"{name}=={version}")
    if absent:
        raise SystemExit(f"[setup] error: pip's plan for {' '.join(pip_arguments)} needs {', '.join(absent)}, which "
                         f"{lock} does not hold (the inputs changed since the lock was made): regenerate the lock "
                         f"with {REGENERATE}, then run the set-up again")
    if not chosen:
        log(f"nothing to install for {' '.join(pip_arguments)}: all at the versions of {lock.name} already")
        return
    install_hashed(sorted(chosen, key=lambda pin: pin.name), [], lock)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s LOCK [--unpinned NAME]... | --exact NAME... -- PIP_INSTALL_ARGUMENTS")
    parser.add_argument("lock", type=Path)
    parser.add_argument("--exact", nargs="+", metavar="NAME", help="install the lock's lines for these, --no-deps")
    parser.add_argument("--unpinned", action="append", default=[], metavar="NAME",
                        help="leave NAME out of the constraints (keep the installed one)")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.pip_arguments = argv[split + 1:]
    if not args.pip_arguments and not args.exact:
        parser.error("nothing to install: give it after --")
    pins = read_lock(args.lock)
    if pip_version() < (22, 2):
        log(f"pip {'.'.join(map(str, pip_version()))} cannot report a plan (needs 22.2): installing the lock's pip")
        install_exact(pins, ["pip"], [], args.lock)
    if args.exact:
        install_exact(pins, args.exact, args.pip_arguments, args.lock)
    else:
        install_resolved(pins, {canonical(name) for name in args.unpinned}, args.pip_arguments, args.lock)


if __name__ == "__main__":
    main()
