"""What gwdet runs on: print it with ``python -m gwdet.collect_env`` (``--json`` for a machine-readable
form) and paste the output into a bug report.

The report is detectron2's own table (:func:`detectron2.utils.collect_env.collect_env_info`) followed
by gwdet's rows: its version and installation, the distribution that owns detectron2 (e.g.
``sal-detectron2``), the registered norm names and components, the whitening layers' execution plan
(:mod:`gwdet.layers.plans`), the CPU threads and the environment variables gwdet reads. Each part is
guarded: a failed import shows as its error. When the package's ``__init__`` does not import, run
this file directly (``python gwdet/collect_env.py``), which imports nothing of gwdet before it reports.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

Rows = dict[str, str]
# Every environment variable gwdet reads (each changes what is built, loaded or registered), and detectron2's datasets
ENVIRONMENT_VARIABLES = ("GWDET_CACHE", "GWDET_GW_PLAN", "GWDET_ALLOW_NORM_MISMATCH", "GWDET_ALLOW_UNSAFE_PICKLE",
                         "GWDET_REGISTER_COCO", "DETECTRON2_DATASETS")


def _error_text(err: BaseException) -> str:
    """How the report shows an exception: its type and the first line of its message."""
    text = str(err).strip()
    return f"error: {type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _guard(probe: Callable[[], str]) -> str:
    try:
        return probe()
    except Exception as err:  # the report must survive any broken package
        return _error_text(err)


# ---- detectron2's table -------------------------------------------------------------------------

def detectron2_table() -> str:
    """detectron2's environment table, or the error that stopped it."""
    try:
        from detectron2.utils.collect_env import collect_env_info as detectron2_env_info

        return detectron2_env_info().rstrip("\n")
    except Exception as err:
        return f"detectron2's environment table: {_error_text(err)}"


def table_rows(table: str) -> Rows:
    """The ``key value`` rows of a table in tabulate's plain format (detectron2's), by the column
    its border line gives; nothing for text that is not such a table."""
    lines = table.splitlines()
    borders = [i for i, line in enumerate(lines) if line.startswith("-") and set(line) <= {"-", " "}]
    if len(borders) < 2:
        return {}
    width = len(lines[borders[0]].split(" ")[0])
    return {line[:width].rstrip(): line[width:].strip() for line in lines[borders[0] + 1:borders[1]]}


# ---- how a package is installed -----------------------------------------------------------------

def _owning_distribution(package_dir: Path) -> importlib.metadata.Distribution | None:
    """The distribution beside ``package_dir`` whose file list holds its ``__init__.py``."""
    wanted = f"{package_dir.name}/__init__.py"
    for dist in importlib.metadata.distributions(path=[str(package_dir.parent)]):
        if any(str(file) == wanted for file in dist.files or ()):
            return dist
    return None


def _direct_url(dist: importlib.metadata.Distribution) -> dict | None:
    text = dist.read_text("direct_url.json")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _editable_owner(package_dir: Path) -> tuple[importlib.metadata.Distribution, str] | None:
    """(distribution, source folder) of an editable install whose source folder holds ``package_dir``."""
    for dist in importlib.metadata.distributions():
        direct = _direct_url(dist) or {}
        url = direct.get("url", "")
        if direct.get("dir_info", {}).get("editable") and url.startswith("file://"):
            folder = url[len("file://"):]
            if package_dir.is_relative_to(Path(folder).resolve()):
                return dist, folder
    return None


def _named(dist: importlib.metadata.Distribution) -> str:
    return f"{dist.metadata['Name']} {dist.version}"


def installed_origin(package_dir: Path) -> str:
    """How the package in ``package_dir`` was installed, in words, with the name and version of
    the distribution that owns it (what ``pip show NAME`` takes)."""
    dist = _owning_distribution(package_dir)
    if package_dir.parent.name == "detectron2-dist":
        return (f"wheel: {_named(dist) if dist else 'a wheel'} unpacked by gwdet's scripts/setup_env.sh (Python "
                "sources only; its compiled _C was built for another torch)")
    if dist is not None:
        direct = _direct_url(dist)
        if direct is None:
            return f"wheel: {_named(dist)} from a package index"
        url = direct.get("url", "?")
        if "vcs_info" in direct:
            return f"source build: {_named(dist)} from {url} at commit {direct['vcs_info'].get('commit_id', '?')}"
        if "dir_info" in direct:
            return f"source build: {_named(dist)} from the folder {url.removeprefix('file://')}"
        return f"archive: {_named(dist)} from {url}"
    editable = _editable_owner(package_dir)
    if editable is not None:
        return f"editable source install: {_named(editable[0])} from {editable[1]}"
    return "source tree on sys.path (no installed distribution owns it)"


def detectron2_origin(package_dir: Path) -> str:
    """How the detectron2 in ``package_dir`` was installed (:func:`installed_origin`)."""
    return installed_origin(package_dir)


# ---- gwdet's rows -------------------------------------------------------------------------------

def _package_dir(module) -> Path:
    return Path(module.__file__).resolve().parent


def _registrations() -> str:
    """The names gwdet put into detectron2's model registries (each ``*_REGISTRY`` that
    ``detectron2.modeling`` exports), per registry."""
    import detectron2.modeling as modeling

    found = []
    for registry_name in sorted(name for name in dir(modeling) if name.endswith("_REGISTRY")):
        registry = getattr(modeling, registry_name)
        names = sorted(name for name, obj in registry or ()
                       if getattr(obj, "__module__", "").split(".")[0] == "gwdet")
        if names:
            found.append(f"{registry_name}: {', '.join(names)}")
    return "; ".join(found) or "none registered"


def _execution_plan() -> str:
    from gwdet.layers.plans import describe_plans

    return describe_plans()


def _threads() -> str:
    import torch

    from gwdet.engine.threads import usable_cpus

    return (f"torch uses {torch.get_num_threads()} (inter-op {torch.get_num_interop_threads()}) of the "
            f"{usable_cpus()} CPUs this process may use ({os.cpu_count()} on the machine)")


def gwdet_rows() -> Rows:
    """gwdet's rows of the report; the import error alone when ``import gwdet`` fails."""
    try:
        import detectron2
        import gwdet
    except Exception as err:
        return {"gwdet": _error_text(err)}
    return {
        "gwdet": f"{getattr(gwdet, '__version__', '?')} @{_package_dir(gwdet)}",
        "gwdet origin": _guard(lambda: installed_origin(_package_dir(gwdet))),
        "detectron2 origin": _guard(lambda: detectron2_origin(_package_dir(detectron2))),
        "norm names": _guard(lambda: ", ".join(gwdet.known_norm_names())),
        "gwdet components": _guard(_registrations),
        "execution plan": _guard(_execution_plan),
        "threads": _guard(_threads),
        **{variable: _variable_row(variable) for variable in ("OMP_NUM_THREADS", *ENVIRONMENT_VARIABLES)},
    }


def _checked_values() -> dict[str, Callable[[], object]]:
    """The functions through which gwdet reads the values of its environment variables that must be of
    a form (an opt-in flag, a JSON list), by variable; each raises, naming the value, for one gwdet
    refuses. (``GWDET_GW_PLAN``'s is the execution plan row's; ``GWDET_CACHE`` takes any folder.)"""
    from gwdet.checkpoint.resilient import MISMATCH_ENV, UNSAFE_PICKLE_ENV, mismatch_allowed, unsafe_pickle_allowed
    from gwdet.data.coco_registration import ENVIRONMENT_VARIABLE as REGISTER_COCO_ENV, environment_datasets

    return {UNSAFE_PICKLE_ENV: unsafe_pickle_allowed, MISMATCH_ENV: mismatch_allowed,
            REGISTER_COCO_ENV: environment_datasets}


def _variable_row(variable: str) -> str:
    """The value of the environment variable ``variable`` (``<not set>``), followed, where gwdet reads
    it through a function that refuses that value, by that refusal."""
    value = os.environ.get(variable)
    if value is None:
        return "<not set>"
    try:
        check = _checked_values().get(variable)
    except Exception as err:  # the report must survive any broken package
        return f"{value}  (cannot check it: {_error_text(err)})"
    if check is not None:
        try:
            check()
        except Exception as err:
            return f"{value}  (gwdet refuses this value: {_error_text(err)})"
    return value


def format_rows(rows: Rows) -> str:
    """``rows`` as a table in the format of detectron2's."""
    width = max(len(key) for key in rows)
    border = f"{'-' * width}  {'-' * max(len(value) for value in rows.values())}"
    return "\n".join([border, *(f"{key.ljust(width)}  {value}" for key, value in rows.items()), border])


def collect_env_info() -> dict[str, Any]:
    """``{"detectron2": detectron2's table (text), "gwdet": gwdet's rows}``."""
    return {"detectron2": detectron2_table(), "gwdet": gwdet_rows()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gwdet.collect_env", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true",
                        help='print {"detectron2": {row: value}, "gwdet": {row: value}} as JSON')
    args = parser.parse_args(argv)
    table, rows = detectron2_table(), gwdet_rows()
    if args.json:
        return write_report(json.dumps({"detectron2": table_rows(table) or {"error": table}, "gwdet": rows}, indent=2))
    return write_report(f"{table}\n{format_rows(rows)}")


PROG = "python -m gwdet.collect_env"


def write_report(text: str, stream: TextIO | None = None) -> int:
    """Print ``text`` to ``stream`` (default: stdout) and flush it; the exit status. A reader that
    stopped reading (``| head -1``) ends the report quietly with status 1, as Python's note on SIGPIPE
    advises; another write error (``> /dev/full``) is one line on stderr and status 2. Either way the
    stream's file descriptor then points at ``os.devnull``, so Python's flush at exit does not fail again."""
    stream = sys.stdout if stream is None else stream
    if stream is None:  # started with its standard output closed (>&-)
        return _cannot_write("standard output is closed")
    try:
        print(text, file=stream)
        stream.flush()
    except OSError as error:  # BrokenPipeError included
        _discard_output(stream)
        if isinstance(error, BrokenPipeError):
            return 1
        return _cannot_write(error.strerror or str(error))
    return 0


def _cannot_write(reason: str) -> int:
    """Say on stderr that the report could not be written, and why; the exit status, 2."""
    print(f"{PROG}: error: cannot write the report: {reason}. Redirect it to a file that can be written "
          "(e.g. > /tmp/gwdet_env.txt).", file=sys.stderr)
    return 2


def _discard_output(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at ``os.devnull`` (nothing for a stream without one)."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    if not __package__:  # run as a file (python gwdet/collect_env.py): works even when gwdet fails to import
        sys.path[0] = str(Path(__file__).resolve().parents[1])  # the checkout, not gwdet/ itself
    sys.exit(main())
