#!/usr/bin/env bash
# Regenerates requirements/lock.txt: the exact versions, with the sha256 hashes the package index
# gives for each of their files, that scripts/setup_env.sh installs (docs/install.md, "The lock").
#
#   scripts/update_lock.sh                         keeps each locked version that still fits the inputs
#   scripts/update_lock.sh --upgrade               the newest versions the inputs allow
#   scripts/update_lock.sh --upgrade-package NAME  the newest NAME (and what it needs), the rest kept
#
# One universal resolution (uv pip compile --universal) for Python 3.10 and newer: where a package's
# version differs by Python or platform, the lock holds one line per version with its environment
# marker (e.g. numpy 2.2.6 for Python 3.10, 2.4.6 from 3.11). Inputs: requirements/lock.in (pip,
# torch, torchvision, setuptools, wheel, OpenCV, requirements/detectron2-runtime.in) and
# pyproject.toml (gwdet's dependencies and all its extras); the registry's detectron2 wheel
# (requirements/detectron2-wheel.in) is locked on its own, without its declared dependencies.
#
# Needs uv (pip install uv; checked with uv 0.13.9) and https://pypi.org; no configuration of uv or
# pip on this machine is read (--no-config, --index-url), so the lock names only pypi.org's files.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
uv="${UV:-uv}"
command -v "$uv" >/dev/null 2>&1 || {
    echo "update_lock: '$uv' not found: install uv (pip install uv) or give its path with UV=/path/to/uv" >&2
    exit 1
}
export UV_PYTHON_DOWNLOADS=never  # resolving for 3.10 needs metadata only, not a Python 3.10
lock=requirements/lock.txt
common=(--no-config --universal --python-version 3.10 --generate-hashes --index-url https://pypi.org/simple
        --custom-compile-command scripts/update_lock.sh)

"$uv" pip compile "${common[@]}" requirements/lock.in pyproject.toml --all-extras -o "$lock" "$@"
wheel="$("$uv" pip compile "${common[@]}" --no-deps --no-header requirements/detectron2-wheel.in)"
printf '\n# The registry'"'"'s detectron2 wheel: scripts/setup_env.sh unpacks it with --no-deps.\n%s\n' "$wheel" >> "$lock"
echo "update_lock: wrote $lock ($(grep -c '^[A-Za-z0-9]' "$lock") pinned lines)"
