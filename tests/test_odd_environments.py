"""Training and resuming where the environment is unusual: an OUTPUT_DIR with spaces and characters
beyond ASCII, the C locale, no HOME (then a HOME that cannot be written), a TMPDIR that does not
exist. One training run and its resume, each a ``tools/train_net.py`` process, as a user runs them.

Python 3.7+ runs in UTF-8 mode in the C and POSIX locales (PEP 538, PEP 540), so the folder's name
reaches every writer unchanged; with that mode switched off (``PYTHONUTF8=0``) gwdet refuses such a
name before writing anything (tests/test_output_safety.py).
"""
import hashlib
import json
import os
import subprocess
import sys

from conftest import DEMO_CONFIG, REPO, TINY_OPTS

# The variables that choose the locale and Python's text encodings, replaced by the C locale.
LOCALE_VARIABLES = ("LANG", "LANGUAGE", "LC_", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONCOERCECLOCALE")


def _environment(home: str | None, tmpdir: str) -> dict:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(LOCALE_VARIABLES) and name not in ("HOME", "TMPDIR")}
    env.update(LC_ALL="C", LANG="C", TMPDIR=tmpdir, OMP_NUM_THREADS="1")  # GWDET_CACHE: the session's
    if home is not None:
        env["HOME"] = home
    return env


def _train(output_dir, env: dict, *extra: str) -> None:
    command = [sys.executable, "tools/train_net.py", "--config", str(DEMO_CONFIG), *TINY_OPTS,
               "SOLVER.CHECKPOINT_PERIOD", "1", "OUTPUT_DIR", str(output_dir), *extra]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-4000:]


def _matches_its_record(path) -> bool:
    recorded = path.with_name(path.name + ".sha256").read_text().split()[0]
    return recorded == hashlib.sha256(path.read_bytes()).hexdigest()


def test_training_and_resume_in_the_c_locale_without_home_into_a_non_ascii_folder(tmp_path):
    run = tmp_path / "run ä 日本"
    missing = str(tmp_path / "no such folder")
    _train(run, _environment(None, missing))
    assert (run / "model_final.pth").is_file() and (run / "last_checkpoint").read_text() == "model_final.pth"
    assert _matches_its_record(run / "config.yaml") and _matches_its_record(run / "results.json")

    home = tmp_path / "home"  # a file where HOME should be a folder: nothing can be written under it, even as root
    home.write_text("not a folder")
    _train(run, _environment(str(home), missing), "SOLVER.MAX_ITER", "3", "TEST.VIS_IMAGES", "1", "--resume")
    records = [json.loads(line) for line in (run / "metrics.json").read_text(encoding="utf-8").splitlines()]
    trained = [record["iteration"] for record in records if "total_loss" in record]
    assert trained == sorted(set(trained)) and trained[-1] == 2, "resumed at iteration 2, no iteration twice"
    assert "SOLVER:\n" in (run / "config.yaml").read_text(encoding="utf-8") and _matches_its_record(run / "config.yaml")
    assert _matches_its_record(run / "results.json")
    assert [p.name for p in (run / "vis").iterdir()], "the drawings (matplotlib without a writable HOME)"
    log = (run / "log.txt").read_text(encoding="utf-8")
    # the resume check runs before detectron2's set-up creates the log; its warning is held until then
    warned = [line for line in log.splitlines() if f"--resume with config values that differ from {run}" in line]
    assert len(warned) == 1 and "SOLVER.MAX_ITER: 2 -> 3" in warned[0], log[-3000:]
    assert not os.path.exists(missing)
