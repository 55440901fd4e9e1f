#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment that gwdet's Makefile targets use.
#
#   scripts/setup_env.sh [VENV_DIR]        (default: .venv in the repository root)
#
# Environment variables (the Makefile passes them on: `make setup PYTHON=python3.12` and
# `PYTHON=python3.12 make setup` are the same):
#   PYTHON      interpreter that creates a new VENV_DIR (default python3); Python 3.10 to 3.13.
#               Checked before anything is created. An existing VENV_DIR made with another
#               Python is not replaced: the script stops and says what to remove.
#   D2_SOURCE   build detectron2 from this source (a checkout folder, or anything `pip install`
#               takes, e.g. git+https://github.com/facebookresearch/detectron2.git) instead of
#               using the registry wheel; this is how detectron2's compiled `_C` gets there.
#               Built once per environment (D2_REBUILD=1 builds it again, e.g. after a git pull).
#   GWDET_EXTRAS  gwdet's extras to install (default lab,deploy,cluster,test; empty: the plugin only).
#
# Versions: every package comes at the version of the lock, requirements/lock.txt, and each
# downloaded file is checked against the lock's sha256 hashes (scripts/locked_install.py: pip's plan
# under the lock's versions, then exactly those packages with --require-hashes). Not from the lock:
# a torch/torchvision or detectron2 you already have (kept as they are), a detectron2 built from
# D2_SOURCE (pip resolves its dependencies), and the Pillow < 10 of detectron2 v0.6. Regenerate the
# lock with scripts/update_lock.sh (docs/install.md, "The lock").
#
# Safe to re-run: every step checks what is already there. Steps:
#   1. the interpreter and its version; a virtual environment with it (a half-made one from an
#      interrupted earlier try is recognised by its marker file and made again);
#   2. torch + torchvision: kept when both already import in the environment (e.g. next to your
#      own detectron2 build); otherwise the lock's (torch 2.14.1 + torchvision 0.29.1);
#   3. detectron2: built from D2_SOURCE when given; else kept when one is importable already (an
#      official install); otherwise the registry repackaging `sal-detectron2` (the lock's wheel,
#      hash-checked) is unpacked into VENV/detectron2-dist and only its `detectron2` package is
#      exposed through a .pth file (the wheel's top-level `tools` package is kept off the import
#      path), plus the runtime dependencies detectron2 declares (requirements/detectron2-runtime.in;
#      that wheel is installed without them); a detectron2 that needs Pillow < 10 (v0.6) gets it;
#   4. OpenCV (opencv-python-headless) only when no cv2 imports: detectron2's Visualizer needs one;
#   5. gwdet's dependencies and extras (pyproject.toml), then gwdet itself (`pip install -e .`,
#      the checkout), then `pip check`.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac  # the .pth file and link below need absolute paths
requested_python="${PYTHON:-}"
python_bin="${requested_python:-python3}"
d2_source="${D2_SOURCE:-}"
extras="${GWDET_EXTRAS-lab,deploy,cluster,test}"
lock="$repo/requirements/lock.txt"
marker="$venv/.gwdet-creating"

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
# A failed step (a download, a build) leaves nothing that blocks a retry: say so.
trap 'printf "[setup] error: the step above failed (exit %s); fix its cause and run the same command again: the set-up continues from what is installed, nothing needs deleting\n" "$?" >&2' ERR

# What an interpreter is: "3.11" for a usable one; empty when it does not run.
python_minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
version_ok() { case "$1" in 3.1[0-9]) return 0 ;; *) return 1 ;; esac; }
tested_versions="3.10, 3.11, 3.12, 3.13"

# 1. Interpreter and virtual environment -----------------------------------------------------
if [ -f "$marker" ]; then
    log "$venv is a half-made environment from an interrupted set-up: making it again"
    rm -rf "$venv"
fi

if [ -e "$venv/bin/python" ]; then
    venv_minor="$(python_minor "$venv/bin/python")"
    [ -n "$venv_minor" ] || die "$venv exists but its python does not run (its interpreter was moved or removed?): remove it with 'rm -rf $venv' and run the set-up again"
    version_ok "$venv_minor" || die "$venv has Python $venv_minor; gwdet needs Python >= 3.10: remove it with 'rm -rf $venv' and run the set-up again with PYTHON=python3.1x"
    if [ -n "$requested_python" ]; then
        requested_minor="$(python_minor "$python_bin")"
        if [ -n "$requested_minor" ] && [ "$requested_minor" != "$venv_minor" ]; then
            die "$venv already exists with Python $venv_minor, and PYTHON=$python_bin is Python $requested_minor. Either remove it ('rm -rf $venv') or keep it and choose another folder for this one: make setup VENV=.venv-$requested_minor PYTHON=$python_bin"
        fi
    fi
    "$venv/bin/python" -m pip --version >/dev/null 2>&1 || die "$venv has no working pip: remove it with 'rm -rf $venv' and run the set-up again"
else
    [ -e "$venv" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ] && \
        die "$venv exists but is not a virtual environment (no bin/python): move or remove it, or choose another folder with VENV=..."
    command -v "$python_bin" >/dev/null 2>&1 || \
        die "PYTHON=$python_bin: no such interpreter. Give a name on PATH or a full path, e.g. PYTHON=python3.12 or PYTHON=\$HOME/.pyenv/versions/3.12.1/bin/python"
    python_minor_version="$(python_minor "$python_bin")"
    [ -n "$python_minor_version" ] || die "PYTHON=$python_bin does not run: $("$python_bin" -c pass 2>&1 | head -1). Give an interpreter that runs, e.g. a full path such as \$HOME/.pyenv/versions/3.12.1/bin/python"
    version_ok "$python_minor_version" || \
        die "PYTHON=$python_bin is Python $python_minor_version; gwdet needs Python >= 3.10 (tested: $tested_versions). Choose another interpreter, e.g. make setup PYTHON=python3.11. Nothing was created."
    case "$python_minor_version" in 3.1[0-3]) ;; *) log "warning: Python $python_minor_version is newer than the tested range ($tested_versions)" ;; esac
    "$python_bin" -c 'import venv, ensurepip' 2>/dev/null || \
        die "$python_bin cannot create virtual environments (no venv/ensurepip module; on Debian/Ubuntu: apt-get install python$python_minor_version-venv). Nothing was created."
    log "creating virtual environment at $venv with $python_bin (Python $python_minor_version)"
    mkdir -p "$venv"
    touch "$marker"
    "$python_bin" -m venv "$venv" || die "creating the virtual environment failed (above); running the set-up again starts it afresh"
    "$venv/bin/python" -m pip --version >/dev/null || die "the new environment has no pip (above); running the set-up again starts it afresh"
    rm -f "$marker"
fi
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check)
[ -f "$lock" ] || die "$lock is missing: it comes with the repository (git checkout requirements/lock.txt), or regenerate it with scripts/update_lock.sh"
# Installs at the lock's versions, hash-checked: `locked [--unpinned NAME]... -- ARGS` resolves ARGS
# (names, -r FILE, -e DIR) under the lock; `locked --exact NAME -- PIP_OPTIONS` installs NAME's line.
locked() { "$py" "$repo/scripts/locked_install.py" "$lock" "$@"; }
locked_version() { sed -n "s/^$1==\([^ ;\\]*\).*/\1/p" "$lock" | head -1; }
# Packages kept as the environment has them, left out of the lock's constraints in later steps.
unpinned=()
log "versions from ${lock#"$repo"/} (exact versions, sha256-checked; regenerate it with scripts/update_lock.sh)"
rm -f "$venv/.gwdet-installed"  # the Makefile's stamp: set again only when this run succeeds

installed_version() {
    "$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true
}

# 2. torch + torchvision -----------------------------------------------------------------------
if "$py" -c "import torch, torchvision" 2>/dev/null; then
    kept="torch $(installed_version torch) and torchvision $(installed_version torchvision)"
    locked_pair="torch $(locked_version torch) and torchvision $(locked_version torchvision)"
    if [ "$kept" = "$locked_pair" ]; then
        log "keeping $kept (the lock's versions)"
    else
        log "keeping $kept, the environment's own (the lock has $locked_pair)"
    fi
    unpinned+=(--unpinned torch --unpinned torchvision)
else
    log "installing torch $(locked_version torch) and torchvision $(locked_version torchvision)"
    locked -- torch torchvision
fi
# setuptools < 81: detectron2's own model_zoo imports pkg_resources (gwdet's LazyConfigs do not
# need it); wheel: for --no-build-isolation builds.
locked ${unpinned[@]+"${unpinned[@]}"} -- "setuptools<81" wheel

# 3. detectron2 --------------------------------------------------------------------------------
dist="$venv/detectron2-dist"
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
pth="$site/gwdet-detectron2.pth"
remove_registry_wheel() {
    if [ -e "$pth" ] || [ -e "$dist" ]; then
        log "removing the registry wheel's copy ($dist): an installed detectron2 replaces it"
        rm -rf "$pth" "$dist"
    fi
}
# Where `import detectron2` would load it from (found without running it: its dependencies may be missing).
detectron2_dir() {
    "$py" -c 'import importlib.util, os; s = importlib.util.find_spec("detectron2"); print(os.path.dirname(os.path.realpath(s.origin)) if s and s.origin else "")' 2>/dev/null || true
}

if [ -n "$d2_source" ]; then
    case "$d2_source" in
        */*|.*) [ -e "$d2_source" ] && d2_source="$(cd "$d2_source" && pwd)" ;;
    esac
    built_from="$("$py" - <<'PY' 2>/dev/null || true
import importlib.metadata, json
print(json.loads(importlib.metadata.distribution("detectron2").read_text("direct_url.json") or "{}").get("url", ""))
PY
)"
    if [ "$built_from" = "file://$d2_source" ] && [ -z "${D2_REBUILD:-}" ]; then
        log "detectron2 is already built from $d2_source: keeping it (D2_REBUILD=1 builds it again)"
    else
        log "building detectron2 from $d2_source (pip install --no-build-isolation; 5 to 15 minutes on 2 cores; pip resolves its dependencies, the lock does not)"
        "${pip[@]}" install --no-build-isolation "$d2_source"
    fi
    remove_registry_wheel
else
    found="$(detectron2_dir)"
    if [ -n "$found" ] && [ "$(dirname "$found")" != "$(realpath -m "$dist")" ]; then
        log "keeping the detectron2 installed at $found"
        remove_registry_wheel
    elif [ -n "$found" ]; then
        log "keeping the registry wheel's detectron2 at $found"
    else
        log "installing sal-detectron2 $(locked_version sal-detectron2) into $dist"
        rm -rf "$dist" "$pth"
        locked --exact sal-detectron2 -- --target "$dist" --python-version 3.10 --implementation cp \
            --only-binary=:all: --platform manylinux2014_x86_64
        # Expose only the detectron2 package: a .pth file adds a folder holding nothing but a link to it.
        mkdir -p "$dist/importable"
        ln -sfn "$dist/detectron2" "$dist/importable/detectron2"
        echo "$dist/importable" > "$pth"
    fi
    if [ -e "$pth" ]; then  # the registry wheel's copy is the one in use
        log "installing the runtime dependencies detectron2 declares (requirements/detectron2-runtime.in)"
        locked ${unpinned[@]+"${unpinned[@]}"} -- -r "$repo/requirements/detectron2-runtime.in"
    fi
fi

# detectron2 up to v0.6 uses PIL.Image.LINEAR, which Pillow 10 removed: detect it by importing.
if ! d2_error="$("$py" -c 'import detectron2.data' 2>&1)"; then
    if printf '%s' "$d2_error" | grep -q "LINEAR"; then
        log "this detectron2 (v0.6 or older) needs Pillow < 10: installing it (not the lock's Pillow)"
        unpinned+=(--unpinned pillow)
        "${pip[@]}" install -q "Pillow<10" || die "installing Pillow < 10 failed; it has wheels for Python 3.10 and 3.11 only (on 3.12/3.13 pip must build it, which needs libjpeg and zlib headers). Use Python 3.10 or 3.11 for detectron2 v0.6, or a detectron2 built from main."
    else
        printf '%s\n' "$d2_error" | tail -5 >&2
        die "detectron2 at $(detectron2_dir) does not import (above); $py $repo/gwdet/collect_env.py shows the environment"
    fi
    "$py" -c 'import detectron2.data' || die "detectron2 still does not import"
fi

# detectron2's Visualizer (gwdet's prediction drawings) imports cv2, which detectron2 leaves to the
# user: any OpenCV package will do, so one is installed only when none is there (two packages
# owning cv2 break each other when one is removed).
if ! "$py" -c 'import cv2' 2>/dev/null; then
    log "no OpenCV in the environment: installing opencv-python-headless (detectron2's Visualizer imports cv2)"
    locked ${unpinned[@]+"${unpinned[@]}"} -- opencv-python-headless
fi

# 5. gwdet -------------------------------------------------------------------------------------
target="$repo"
[ -n "$extras" ] && target="$repo[$extras]"
log "installing gwdet's dependencies${extras:+ and extras $extras}"
locked ${unpinned[@]+"${unpinned[@]}"} -- --no-build-isolation -e "$target"
log "installing gwdet (editable, from $repo)"
"${pip[@]}" install -q --no-deps --no-build-isolation -e "$target"
if check="$("${pip[@]}" check 2>&1)"; then
    log "pip check: $check"
else
    log "warning: pip check reports conflicts:"
    printf '%s\n' "$check" >&2
fi
log "done: $("$py" -c 'import sys, torch, detectron2; print("Python", sys.version.split()[0], "torch", torch.__version__, "detectron2", detectron2.__version__)')"
