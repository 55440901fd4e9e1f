#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment that gwdet's Makefile targets use.
#
#   scripts/setup_env.sh [VENV_DIR]        (default: .venv in the repository root)
#
# Safe to re-run: every step checks what is already there. Steps:
#   1. a virtual environment with the running python3 (3.10 or newer);
#   2. torch 2.14.1 + torchvision 0.29.1 (the builds that load on these machines, CPU or CUDA);
#   3. detectron2: skipped when one is importable already (an official install); otherwise the
#      registry repackaging `sal-detectron2` is unpacked into VENV/detectron2-dist and only its
#      `detectron2` package is exposed through a .pth file (the wheel's top-level `tools` package
#      is kept off the import path);
#   4. detectron2's runtime dependencies and gwdet itself (`pip install -e .`).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac  # the .pth file and link below need absolute paths
python_bin="${PYTHON:-python3}"
torch_version="2.14.1"
torchvision_version="0.29.1"
detectron2_wheel="sal-detectron2==0.7.2"

log() { printf '[setup] %s\n' "$*"; }

if [ ! -x "$venv/bin/python" ]; then
    log "creating virtual environment at $venv"
    "$python_bin" -m venv "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check)

"$py" - <<'PY' || { echo "gwdet needs Python >= 3.10" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY

installed_version() {
    "$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true
}

if [ "$(installed_version torch)" != "$torch_version" ] || \
   [ "$(installed_version torchvision)" != "$torchvision_version" ]; then
    log "installing torch $torch_version and torchvision $torchvision_version"
    "${pip[@]}" install "torch==$torch_version" "torchvision==$torchvision_version"
fi

log "installing detectron2's runtime dependencies"
"${pip[@]}" install -q "setuptools<81" wheel fvcore iopath pycocotools "omegaconf>=2.1,<2.4" \
    "hydra-core>=1.1" yacs tabulate termcolor cloudpickle tqdm matplotlib tensorboard Pillow numpy \
    opencv-python-headless scikit-learn pytest

if "$py" -c "import detectron2" 2>/dev/null; then
    log "detectron2 already importable: $("$py" -c 'import detectron2, os; print(os.path.dirname(detectron2.__file__))')"
else
    dist="$venv/detectron2-dist"
    log "installing $detectron2_wheel into $dist"
    rm -rf "$dist"
    "${pip[@]}" install -q --no-deps --target "$dist" --python-version 3.10 --implementation cp \
        --only-binary=:all: --platform manylinux2014_x86_64 "$detectron2_wheel"
    # Expose only the detectron2 package: a .pth file adds a folder holding nothing but a link to it.
    mkdir -p "$dist/importable"
    ln -sfn "$dist/detectron2" "$dist/importable/detectron2"
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$dist/importable" > "$site/gwdet-detectron2.pth"
    "$py" -c "import detectron2" || { echo "detectron2 failed to import after install" >&2; exit 1; }
fi

log "installing gwdet (editable)"
"${pip[@]}" install -q --no-deps --no-build-isolation -e "$repo"
log "done: $("$py" -c 'import torch, detectron2; print("torch", torch.__version__, "detectron2", detectron2.__version__)')"
