#!/usr/bin/env bash
# The compatibility check run before a release (`make test-matrix`): for each available Python, an
# environment of its own made by scripts/setup_env.sh, then the test suite, `pip check` and what
# `python -m gwdet.collect_env` says about detectron2. The default CI stays on one Python.
#
#   scripts/test_matrix.sh
#
# Environment variables:
#   PYTHONS      versions to try (default "3.10 3.11 3.12 3.13"); each is looked up as pythonX.Y on
#                PATH, then under ~/.pyenv/versions/X.Y.*; a version not found is reported, not fatal.
#   D2_SOURCE    a detectron2 source tree (or pip-installable spec) to build into every environment
#                instead of the registry wheel (see setup_env.sh); environments are then named
#                pyX.Y-d2src-NAME (NAME: the source folder's name).
#   MATRIX_DIR   where the environments and logs go (default .venv-matrix in the repository; it is
#                made to ignore itself in git).
#   PYTEST_ARGS  what pytest runs (default "-q tests").
#
# Results: one row per environment in MATRIX_DIR/results.md (printed at the end), logs beside it.
# Exit status: non-zero when any environment failed to set up or failed a test.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
versions="${PYTHONS:-3.10 3.11 3.12 3.13}"
d2_source="${D2_SOURCE:-}"
matrix_dir="${MATRIX_DIR:-$repo/.venv-matrix}"
pytest_args="${PYTEST_ARGS:--q tests}"
mkdir -p "$matrix_dir"
matrix_dir="$(cd "$matrix_dir" && pwd)"
[ -e "$matrix_dir/.gitignore" ] || echo '*' > "$matrix_dir/.gitignore"
results="$matrix_dir/results.md"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # small shared machines: see docs/benchmarks.md, "Busy machine"

log() { printf '[matrix] %s\n' "$*"; }

is_version() {  # does interpreter $1 run and report version $2?
    [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$2" ]
}

find_python() {  # prints an interpreter for version $1, or nothing
    local candidate
    candidate="$(command -v "python$1" 2>/dev/null)"  # (a pyenv shim may exist and still not run)
    if [ -n "$candidate" ] && is_version "$candidate" "$1"; then echo "$candidate"; return; fi
    for candidate in $(ls -d "$HOME/.pyenv/versions/$1".* 2>/dev/null | sort -V -r); do
        if is_version "$candidate/bin/python" "$1"; then echo "$candidate/bin/python"; return; fi
    done
}

d2_label="registry wheel"
suffix=""
if [ -n "$d2_source" ]; then
    d2_label="built from $d2_source"
    suffix="-d2src-$(basename "${d2_source%/}")"
fi

{
    echo "Command: PYTHONS=\"$versions\"${d2_source:+ D2_SOURCE=$d2_source} make test-matrix (OMP_NUM_THREADS=$OMP_NUM_THREADS)"
    echo "Date: $(date -u +%Y-%m-%d); machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(uname -m), $(uname -sr), $(command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | head -1 || echo no GPU)"
    echo "gwdet: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' plus uncommitted changes')"
    echo
    echo "| Python | detectron2 | detectron2._C | torch | tests | pip check | set-up + tests |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
} > "$results"

failed=0
for version in $versions; do
    interpreter="$(find_python "$version")"
    if [ -z "$interpreter" ]; then
        log "Python $version: not found (neither python$version on PATH nor ~/.pyenv/versions/$version.*)"
        echo "| $version | $d2_label | - | - | not run: no interpreter found | - | - |" >> "$results"
        continue
    fi
    venv="$matrix_dir/py$version$suffix"
    log "Python $version ($interpreter) -> $venv"
    start=$(date +%s)
    if ! PYTHON="$interpreter" D2_SOURCE="$d2_source" bash scripts/setup_env.sh "$venv" > "$venv.setup.log" 2>&1; then
        log "Python $version: set-up failed, see $venv.setup.log"
        echo "| $version | $d2_label | - | - | set-up failed: $(grep 'error:' "$venv.setup.log" | tail -1 | cut -c1-120) | - | $(( $(date +%s) - start )) s |" >> "$results"
        failed=1
        continue
    fi
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
    "$venv/bin/python" -m pytest -p no:cacheprovider $pytest_args > "$venv.test.log" 2>&1
    status=$?
    [ $status -eq 0 ] || failed=1
    summary="$(tail -1 "$venv.test.log" | sed 's/=//g; s/^ *//; s/ *$//')"
    [ $status -eq 5 ] && { summary="no tests collected"; failed=1; }
    check="$("$venv/bin/python" -m pip --disable-pip-version-check check 2>&1 | head -3 | tr '\n' ' ')"
    [ "$check" = "No broken requirements found. " ] && check="clean"
    read -r d2 c_ext torch_version < <("$venv/bin/python" - <<'PY' 2>/dev/null
import json, subprocess, sys
report = json.loads(subprocess.run([sys.executable, "-m", "gwdet.collect_env", "--json"],
                                   capture_output=True, text=True, check=True).stdout)
d2 = report["detectron2"]  # detectron2's own table; gwdet's rows under "gwdet"
origin = report["gwdet"].get("detectron2 origin", "?").split(":")[0]
print(f"{d2.get('detectron2', '?').split(' @')[0]}_({origin})".replace(" ", "_"),
      "missing" if "detectron2._C" in d2 else "loads",  # the row appears only when _C fails to load
      d2.get("PyTorch", "?").split(" @")[0])
PY
)
    echo "| $("$venv/bin/python" -c 'import platform; print(platform.python_version())') | ${d2//_/ }${d2_source:+, from $d2_source} | ${c_ext:-?} | ${torch_version:-?} | $summary | $check | $(( $(date +%s) - start )) s |" >> "$results"
    log "Python $version: $summary (pip check: $check)"
done

echo
cat "$results"
exit $failed
