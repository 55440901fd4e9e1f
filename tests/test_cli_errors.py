"""The tools' short errors (gwdet.utils.cli_errors): a gwdet.errors.GwdetError prints
``<tool>: error: <message>`` and a line on --verbose, exit status 2; bugs and other packages' errors
keep their traceback; --verbose shows every traceback. Every exception class of gwdet is a
GwdetError, and every raise of a plain built-in type is a listed check for a bug. And the cases of
docs/reliability.md that printed a raw traceback before (process counts, a missing _BASE_, weights
at an unreachable URL, an --out that is a file)."""
import ast
import builtins
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

import gwdet
import gwdet_lab
from gwdet.checkpoint.resilient import ResilientCheckpointer, WeightsDownloadError
from gwdet.cluster import training
from gwdet.errors import GwdetError, GwdetKeyError, GwdetValueError
from gwdet.utils.cli_errors import output_path_problem, reported_errors, run_tool, split_verbose

from conftest import DEMO_CONFIG, REPO


def test_a_gwdet_error_prints_one_message_and_exits_2(capsys):
    with pytest.raises(SystemExit) as stop:
        with reported_errors("some_tool.py"):
            raise GwdetKeyError("MODEL.GWW is not a config key: see gwdet/config.py")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["some_tool.py: error: MODEL.GWW is not a config key: see gwdet/config.py",
                                "some_tool.py: --verbose shows the Python traceback of this error"]


@pytest.mark.parametrize("error", [ValueError("a check that should not fail"), AttributeError("missing"),
                                   FileNotFoundError("raised by another package")], ids=type)
def test_every_other_error_keeps_its_traceback(error):
    with pytest.raises(type(error)) as raised:
        with reported_errors("tool"):
            raise error
    assert raised.value is error and raised.value.__traceback__ is not None


def test_verbose_keeps_a_gwdet_error_and_system_exit_passes_through():
    with pytest.raises(GwdetValueError, match="on purpose"):
        with reported_errors("tool", verbose=True):
            raise GwdetValueError("on purpose")
    with pytest.raises(SystemExit, match="a message of the tool's own"):
        with reported_errors("tool"):
            raise SystemExit("a message of the tool's own")


def test_ctrl_c_ends_a_tool_with_one_line_and_status_130(capsys):
    # a raw KeyboardInterrupt traceback after Ctrl-C in --eval-only, export, --report-only
    def interrupted(argv):
        raise KeyboardInterrupt  # what Python's SIGINT handler raises (pytest-xdist's workers ignore SIGINT)

    with pytest.raises(SystemExit) as stop:
        run_tool(interrupted, [], "export_model.py")
    assert stop.value.code == 130
    assert capsys.readouterr().err == ("export_model.py: interrupted (Ctrl-C); run the command again to finish what "
                                       "it had not finished (a training: with --resume; --verbose shows where it "
                                       "stopped).\n")
    with pytest.raises(KeyboardInterrupt):
        run_tool(interrupted, ["--verbose"], "export_model.py")

    # Ctrl-C while a TorchScript model runs (the export's check of its file): torch's interpreter raises it as a
    # RuntimeError, which printed 250 lines of TorchScript traceback and status 1
    def interrupted_in_torchscript(argv):
        raise RuntimeError("The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript "
                           "(most recent call last):\n  File \"code/__torch__.py\", line 9, in forward\n"
                           "RuntimeError: KeyboardInterrupt: <EMPTY MESSAGE>\n")

    with pytest.raises(SystemExit) as stop:
        run_tool(interrupted_in_torchscript, [], "export_model.py")
    assert stop.value.code == 130 and "export_model.py: interrupted (Ctrl-C)" in capsys.readouterr().err

    def failed(argv):
        raise RuntimeError("a bug, not an interrupt")

    with pytest.raises(RuntimeError, match="a bug"):
        run_tool(failed, [], "export_model.py")


@pytest.mark.parametrize("lines, status, message", [
    (20000, 141, "tool: stopped: the program reading its output closed it (e.g. | head) while the tool was still "
                 "printing, so whatever the tool had left to do after that line was not done."),
    (2, 0, ""),  # printed into Python's buffer, which finds no reader only at the end: the work is done
])
def test_output_cut_short_by_its_reader_is_one_line_not_a_traceback(lines, status, message):
    # before: a BrokenPipeError traceback and status 1 from `tools/convert_pretrained.py ... | head -4`
    script = ("import sys, time\nfrom gwdet.utils.cli_errors import run_tool\n"
              f"def work(argv):\n    time.sleep(0.5)\n    for i in range({lines}): print('line', i)\n    return 0\n"
              "sys.exit(run_tool(work, [], 'tool'))\n")
    buffered = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}  # a pipe's default
    tool = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=buffered)
    tool.stdout.close()  # the reader is gone before the tool prints (as head after its lines)
    err = tool.stderr.read().decode()
    assert tool.wait(timeout=60) == status
    assert "Traceback" not in err and "BrokenPipeError" not in err and message in err


def test_output_and_errors_cut_short_by_one_reader_are_said_in_the_runs_log(tmp_path):
    # `train_net.py ... 2>&1 | head`: the stop line found no reader either, the status was 1 and log.txt said nothing
    log = tmp_path / "log.txt"
    script = ("import logging, sys, time\nfrom gwdet.utils.cli_errors import run_tool\n"
              f"logging.getLogger('gwdet').addHandler(logging.FileHandler({str(log)!r}))\n"
              "def work(argv):\n    time.sleep(0.5)\n    for i in range(20000): print('line', i)\n    return 0\n"
              "sys.exit(run_tool(work, [], 'tool'))\n")
    buffered = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    tool = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=buffered)
    tool.stdout.close()  # one reader of both, gone
    assert tool.wait(timeout=60) == 141
    assert log.read_text().startswith("tool: stopped: the program reading its output closed it (e.g. | head)")


def test_run_tool_hands_the_work_the_command_line_without_verbose(capsys):
    seen = []

    def work(argv):
        seen.append(argv)
        if "fail" in argv:
            raise GwdetValueError("--fail: refused")
        return 7

    assert run_tool(work, ["a", "--verbose", "b"]) == 7 and seen == [["a", "b"]]
    with pytest.raises(SystemExit) as stop:
        run_tool(work, ["fail"], "tool")
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("tool: error: --fail: refused\n")
    with pytest.raises(GwdetValueError):
        run_tool(work, ["fail", "--verbose"], "tool")


def _modules(package):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith(".__main__"):
            continue  # runs a tool
        try:
            yield importlib.import_module(info.name)
        except ImportError as error:  # an optional package (submitit, onnx, ...) that is not installed
            if (error.name or "gwdet").split(".")[0] in ("gwdet", "gwdet_lab"):
                raise


# Exception classes that are not refusals: signals caught inside gwdet (an unpickler's refusal of a
# global; a Triton kernel that cannot run here, which falls back to the accelerator formulas) and the
# training's stop on a signal (a SystemExit with the status 128 + signal).
NOT_REFUSALS = {"gwdet.checkpoint.safe_load.UnsafeGlobal", "gwdet.layers.plans.triton_plan.KernelUnavailable",
                "gwdet.checkpoint.signal_hook.TrainingInterrupted",
                "gwdet.checkpoint.signal_hook._EvaluationStopped",  # caught where it is raised: it ends an evaluation
                "gwdet.convert.cli._Terminated",  # SIGTERM during a conversion, caught by the converter's main
                "gwdet.model_zoo.lazy_loading._SavedStrictError"}  # caught by the loader, which names the file


def test_every_exception_class_of_gwdet_and_the_lab_is_a_gwdet_error():
    classes = {f"{cls.__module__}.{cls.__qualname__}": cls
               for package in (gwdet, gwdet_lab) for module in _modules(package)
               for _, cls in inspect.getmembers(module, inspect.isclass)
               if issubclass(cls, BaseException) and not issubclass(cls, Warning)  # a warning's category: no raise
               and cls.__module__.split(".")[0] in ("gwdet", "gwdet_lab")}
    assert len(classes) > 25
    assert NOT_REFUSALS <= set(classes)
    assert not [name for name, cls in classes.items() if name not in NOT_REFUSALS and not issubclass(cls, GwdetError)]


# Raises of plain built-in exceptions: checks for a bug (an argument no caller gives, a value no
# input reaches), which keep their traceback. A refusal of the user's input raises a gwdet.errors
# class instead (or a gwdet error class of its own kind), so the tools print its message.
INTERNAL_GUARDS = {
    ("gwdet/cluster/executor.py", "make_executor", "ValueError"),
    ("gwdet/cluster/jobs.py", "__call__", "NotImplementedError"),
    ("gwdet/data/finite_images.py", "__getattr__", "AttributeError"),
    ("gwdet/engine/lazy.py", "saved_tree", "TypeError"),
    ("gwdet_lab/tables.py", "add", "KeyError"),
    ("gwdet/engine/threads.py", "choose_threads", "ValueError"),
    ("gwdet/layers/plans/base.py", "chunk_size", "NotImplementedError"),
    # reached only where detectron2 does not import, and gwdet's tools with it:
    ("gwdet/model_zoo/detectron2_configs.py", "detectron2_configs_dir", "ModuleNotFoundError"),
    ("gwdet_lab/benchmark/kernel_resources.py", "local_memory", "RuntimeError"),  # ptxas changed its output
    ("gwdet_lab/benchmark/measure.py", "median_ratio", "ValueError"),
    ("gwdet_lab/study/record.py", "plan", "ValueError"),
    ("gwdet_lab/study/scheduler.py", "__init__", "ValueError"),
}


BUILT_IN_ERRORS = {name for name, value in vars(builtins).items()
                   if isinstance(value, type) and issubclass(value, BaseException)}


def _plain_raises(path):
    tree = ast.parse(path.read_text())
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in ast.walk(tree):
        raised = node.exc.func if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) else \
            node.exc if isinstance(node, ast.Raise) else None
        if isinstance(raised, ast.Name):
            name = raised.id
            if name in BUILT_IN_ERRORS and name != "SystemExit":
                inner = min((f for f in functions if f.lineno <= node.lineno <= f.end_lineno),
                            key=lambda f: f.end_lineno - f.lineno, default=None)
                yield node.lineno, (inner.name if inner else "<module>"), name


def test_every_plain_built_in_raise_is_a_listed_check_for_a_bug():
    found = {(str(path.relative_to(REPO)), function, name): line
             for folder in ("gwdet", "gwdet_lab") for path in sorted((REPO / folder).rglob("*.py"))
             for line, function, name in _plain_raises(path)}
    unlisted = [f"{path}:{line} {function}: raise {name}" for (path, function, name), line in found.items()
                if (path, function, name) not in INTERNAL_GUARDS]
    assert not unlisted, ("a refusal of the user's input raises a gwdet.errors class (GwdetValueError, ...), "
                          "which the tools print without a traceback; a check for a bug goes into INTERNAL_GUARDS: "
                          + "; ".join(unlisted))
    assert set(found) == INTERNAL_GUARDS, "INTERNAL_GUARDS names a raise that is gone"


def test_verbose_is_taken_out_of_the_command_line_wherever_it_stands():
    assert split_verbose(["--config", "a.yaml", "MODEL.WEIGHTS", "w.pth", "--verbose"]) == (
        ["--config", "a.yaml", "MODEL.WEIGHTS", "w.pth"], True)
    assert split_verbose(["--config", "a.yaml"]) == (["--config", "a.yaml"], False)


def _parsers():
    from gwdet.convert.cli import argument_parser as convert_parser
    from gwdet.engine.arguments import argument_parser as train_parser
    from gwdet.export.analyze_model import argument_parser as analyze_model_parser
    from gwdet.export.export_model import argument_parser as export_parser
    from gwdet_lab.benchmark.cli import argument_parser as benchmark_parser
    from gwdet_lab.study.cli import argument_parser as study_parser

    return [train_parser(), convert_parser(), export_parser(), analyze_model_parser(), study_parser(), benchmark_parser()]


def test_every_tool_lists_verbose_in_its_help():
    from gwdet_lab.analysis.cli import argument_parser as analysis_parser

    for parser in _parsers():
        assert "--verbose" in parser.format_help(), parser.prog
    assert analysis_parser().parse_args(["conditioning", "--verbose"]).verbose


# ---- the cases that printed a raw traceback -------------------------------------------------------

@pytest.mark.parametrize("flags,fragment", [
    (["--num-gpus", "0"], "--num-gpus 0: give the number of processes to start on this machine, at least 1"),
    (["--num-machines", "0"], "--num-machines 0: give the number of machines of the run, at least 1"),
    (["--num-machines", "2", "--machine-rank", "2"], "--machine-rank 2: give this machine's index, from 0 to"),
    (["--threads", "0"], "--threads 0: give the CPU threads of each process, at least 1"),
    # before: waited at 127.0.0.1 for machines that could not reach it, silent for the rendezvous timeout
    (["--num-machines", "2", "--machine-rank", "0"], "--num-machines 2 without --dist-url: the default, "
                                                     "tcp://127.0.0.1:"),
])
def test_process_counts_below_one_are_usage_errors(capsys, flags, fragment):
    with pytest.raises(SystemExit) as stop:
        training.run(["--config-file", str(DEMO_CONFIG), *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err, err


@pytest.fixture
def config_with_a_missing_base(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text('_BASE_: "../Base-RCNN-FPN.yaml"\nSOLVER:\n  MAX_ITER: 1\n')
    return config


def test_a_missing_base_names_the_base_the_config_and_the_fix(capsys, config_with_a_missing_base, monkeypatch):
    config = config_with_a_missing_base
    monkeypatch.setattr(sys, "argv", [str(REPO / "tools" / "train_net.py")])  # as the tool starts
    with pytest.raises(SystemExit) as stop:
        training.run(["--config-file", str(config)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    for fragment in (f"train_net.py: error: Config file '{config}' names _BASE_: '../Base-RCNN-FPN.yaml'",
                     f"there is no file {config.parent.parent / 'Base-RCNN-FPN.yaml'}",
                     f"Correct the _BASE_ line of {config}", "gwdet ships a config of that name: ",
                     "--verbose shows the Python traceback"):
        assert fragment in err, err
    with pytest.raises(FileNotFoundError, match="names _BASE_"):
        training.run(["--config-file", str(config), "--verbose"])


def test_a_missing_base_of_a_base_names_the_chain_and_a_cycle_is_refused(tmp_path):
    from gwdet.model_zoo import build_config
    from gwdet.engine.run import load_run_config

    (tmp_path / "top.yaml").write_text('_BASE_: "mid.yaml"\n')
    (tmp_path / "mid.yaml").write_text('_BASE_: ["missing/deeper.yaml"]\n')
    for load in (build_config, load_run_config):  # the yacs loader, and the one every tool reads configs with
        with pytest.raises(FileNotFoundError) as err:
            load(str(tmp_path / "top.yaml"))
        assert (f"Config file '{tmp_path / 'mid.yaml'}' (a base of '{tmp_path / 'top.yaml'}') names _BASE_: "
                f"'missing/deeper.yaml', but there is no file {tmp_path / 'missing' / 'deeper.yaml'}") in str(err.value)
    (tmp_path / "loop.yaml").write_text('_BASE_: "loop.yaml"\n')
    with pytest.raises(ValueError, match="a config is its own base"):
        build_config(str(tmp_path / "loop.yaml"))


@pytest.mark.parametrize("program", ["/env/bin/gwdet-train", "tools/train_net.py"])
def test_the_errors_call_the_tool_by_the_name_it_was_started_as(capsys, monkeypatch, program,
                                                                  config_with_a_missing_base):
    """The console script gwdet-train and tools/train_net.py run the same code; each error names
    the program as the user typed it, as argparse's own usage errors do."""
    monkeypatch.setattr(sys, "argv", [program])
    name = program.rsplit("/", 1)[-1]
    for flags, message in ((["--config-file", str(config_with_a_missing_base)], "error: Config file"),
                           (["--config-file", str(DEMO_CONFIG), "--threads", "0"], "error: --threads 0: give"),
                           (["--config-file", str(DEMO_CONFIG), "--threads", "x"], "error: argument --threads:")):
        with pytest.raises(SystemExit) as stop:
            training.run(flags)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert f"{name}: {message}" in err, err
        assert ("train_net.py" in err) == (name == "train_net.py"), err


def test_the_real_command_line_prints_no_traceback(config_with_a_missing_base):
    completed = subprocess.run([sys.executable, str(REPO / "tools" / "train_net.py"), "--config-file",
                                str(config_with_a_missing_base)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr and "train_net.py: error: Config file" in completed.stderr, completed.stderr


@pytest.mark.parametrize("setting", ["MODEL.WEIGHTS", "train.init_checkpoint"])
def test_weights_at_an_unreachable_url_name_the_url_the_reason_and_the_fix(tmp_path, setting):
    url = "http://127.0.0.1:9/R-50.pkl"  # the discard port: nothing listens there
    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path), weights_setting=setting)
    with pytest.raises(WeightsDownloadError) as err:
        checkpointer.resume_or_load(url, resume=False)
    message = str(err.value)
    for fragment in (f"{setting} {url} cannot be downloaded", "Connection refused",
                     "download the file on a machine that has internet access", f"set {setting} to that local file"):
        assert fragment in message, message
    assert isinstance(err.value, GwdetError), "the tools print it without a traceback"


def test_a_catalog_name_that_cannot_be_downloaded_is_named_with_its_web_address_and_a_copy_with_its_suffix(tmp_path):
    # "copy it here (e.g. to weights/R-50)": no address to fetch on another machine, and a name without .pkl
    from gwdet.checkpoint.resilient import web_address

    checkpointer = ResilientCheckpointer(torch.nn.Linear(2, 2), str(tmp_path))
    name = "catalog://ImageNetPretrained/MSRA/R-50"
    message = str(checkpointer._not_downloaded(name, name, "[Errno -2] Name or service not known"))
    assert ("download the file (https://dl.fbaipublicfiles.com/detectron/ImageNetPretrained/MSRA/R-50.pkl) on a "
            "machine that has internet access, copy it here (e.g. to weights/R-50.pkl)") in message, message
    assert web_address("detectron2://ImageNetPretrained/MSRA/R-50.pkl") == \
        "https://dl.fbaipublicfiles.com/detectron2/ImageNetPretrained/MSRA/R-50.pkl"
    assert web_address("catalog://no/such/name") == "catalog://no/such/name"


@pytest.mark.parametrize("folder", [True, False], ids=["folder", "file"])
def test_output_path_problems_name_the_flag_and_the_path(tmp_path, folder):
    blocker = tmp_path / "results.md"
    blocker.write_text("a file")
    below = blocker / "sub" / "x"
    assert f"--out {below}: {blocker} is a file, so no" in output_path_problem("--out", below, folder)
    assert output_path_problem("--out", tmp_path / "new" / "deeper", folder) is None
    if folder:
        assert output_path_problem("--out", blocker, True).startswith(f"--out {blocker} is a file, not a folder")
    else:
        assert output_path_problem("--out", tmp_path, False).startswith(f"--out {tmp_path} is a folder")


@pytest.mark.parametrize("tool", ["compare_norms", "analyze", "benchmark"])
def test_lab_tools_refuse_an_out_below_or_at_a_file(tmp_path, capsys, tool):
    from gwdet_lab.analysis.cli import main as analysis_main
    from gwdet_lab.benchmark.cli import main as benchmark_main
    from gwdet_lab.study.cli import main as study_main

    blocker = tmp_path / "file.txt"
    blocker.write_text("a file")
    out = blocker if tool != "benchmark" else blocker / "report.md"
    run = {"compare_norms": lambda: study_main(["--out", str(out), "--study", "paper", "--list"], repo_root=REPO),
           "analyze": lambda: analysis_main(["conditioning", "--out", str(out)]),
           "benchmark": lambda: benchmark_main(["--layers", "--quick", "--out", str(out)])}[tool]
    with pytest.raises(SystemExit) as stop:
        run()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --out {out}" in err and "file" in err and "Traceback" not in err, err
    assert blocker.read_text() == "a file"


@pytest.mark.parametrize("opts, message", [
    (["SOLVER.MAX_ITR", "1"], "The KEY VALUE overrides: SOLVER.MAX_ITR is not a key of detectron2's or gwdet's config. "
                              "Did you mean SOLVER.MAX_ITER?"),
    # a registered norm's key read by the tool (a run of it evaluated): "add_*_config", which a tool user cannot call
    (["NO_SUCH.KEY", "1"], "The KEY VALUE overrides: NO_SUCH.KEY is not a key of detectron2's or gwdet's config. (A "
                           "project's own keys are added by its add_*_config function before the config is read; a norm "
                           "registered with gwdet.register_norm adds its config_keys in the script that registers it: "
                           "read a config of such a norm, a run's config.yaml say, with that script"),
    (["SOLVER.BASE_LR", "0,02"], "The KEY VALUE overrides: SOLVER.BASE_LR takes a value of type float (it is 0.02 "
                                 "before this value); got 0,02 (a str)."),
    # the p = inf of gradient clipping's max norm, which yacs cannot read as a float
    (["SOLVER.CLIP_GRADIENTS.NORM_TYPE", "inf"], "The KEY VALUE overrides: SOLVER.CLIP_GRADIENTS.NORM_TYPE takes a value of "
     "type float (it is 2.0 before this value); got inf (a str). yacs reads no inf; a number too large for a float is "
     "one: SOLVER.CLIP_GRADIENTS.NORM_TYPE 1e999."),
    # an empty default printed as nothing: "(it is  before this value)"
    (["MODEL.RESNETS.GW_POSITIONS", "", "MODEL.RESNETS.GW_POSITIONS", "['S1']"],
     "The KEY VALUE overrides: MODEL.RESNETS.GW_POSITIONS takes a value of type str (it is '' before this value); got "
     "['S1'] (a list)."),
    (["MODEL.RESNETS", "1"], "The KEY VALUE overrides: MODEL.RESNETS is a section of keys, not a value: set one of "
                             "its keys (e.g. MODEL.RESNETS.<KEY> VALUE)."),
    (["SOLVER.MAX_ITER"], "The KEY VALUE overrides: overrides come in KEY VALUE pairs; ['SOLVER.MAX_ITER'] has a key "
                          "without its value."),
    # a LazyConfig's key=value given to a yacs config (before: "has a key without its value", or for
    # two of them "train.max_iter=2 is not a key")
    (["train.max_iter=2", "OUTPUT_DIR", "out"], "The KEY VALUE overrides: 'train.max_iter=2' is key=value, which a "
                                                "LazyConfig (.py) takes; a yacs config takes KEY VALUE pairs"),
    (["SOLVER.MAX_ITER", "2", "OUTPUT_DIR=out", "x"], "The KEY VALUE overrides: 'OUTPUT_DIR=out' is key=value"),
    # "(5)" is 5, and "(shapes_train,)" text: "takes a value of type tuple ... got 5 (a int)", no way on
    (["SOLVER.STEPS", "(5)"], "The KEY VALUE overrides: SOLVER.STEPS takes a value of type tuple (it is (800, 950) "
                              "before this value); got 5 (a int). A number in parentheses is that number, not a "
                              "tuple: a tuple of one value is written with a comma, SOLVER.STEPS \"(5,)\"."),
    (["DATASETS.TEST", "[mine, theirs]"], "The KEY VALUE overrides: DATASETS.TEST takes a value of type tuple (it is "
                                          "('shapes_val',) before this value); got [mine, theirs] (a str). It was read "
                                          "as text, since the names in it are not quoted: quote each one, DATASETS.TEST "
                                          "\"('mine', 'theirs')\"."),
    # '("shapes_val")' is the text shapes_val, and 007 no number: the type named, no way on
    (["DATASETS.TEST", '("shapes_val")'], "The KEY VALUE overrides: DATASETS.TEST takes a value of type tuple (it is "
                                          "('shapes_val',) before this value); got shapes_val (a str). A name alone (or "
                                          "in parentheses without a comma) is no tuple: a tuple of one name is written "
                                          "with a comma, DATASETS.TEST \"('shapes_val',)\"."),
    (["SEED", "007"], "The KEY VALUE overrides: SEED takes a value of type int (it is 0 before this value); got 007 (a "
                      "str). A number written with a leading zero is read as text (Python reads no such number): write "
                      "SEED 7."),
    # an empty key (an unset shell variable): yacs' bare "Non-existent key: "
    (["", "3"], "The KEY VALUE overrides: a key is empty (''; a shell variable that is not set, as in \"$KEY\" VALUE?): "
                "give the key of each value, e.g. MODEL.GW.NUM_GROUPS 8."),
])
def test_config_overrides_yacs_cannot_merge_are_explained(opts, message):
    from gwdet.model_zoo import build_config

    with pytest.raises(ValueError) as err:
        build_config(str(DEMO_CONFIG), opts)
    assert str(err.value).startswith(message) and isinstance(err.value, GwdetError)


def test_a_base_written_in_lower_case_is_named(tmp_path):
    # "_base_ is not a key ... (A project's own keys are added by its add_*_config function ...)": no word of _BASE_
    from gwdet.model_zoo import build_config

    config = tmp_path / "lower.yaml"
    config.write_text(f'_base_: "{DEMO_CONFIG}"\n')
    with pytest.raises(ValueError) as err:
        build_config(str(config))
    assert "_base_ is not a key of detectron2's or gwdet's config: a config names the config it extends as _BASE_, " \
           "in upper case" in str(err.value)


def test_yamls_off_for_a_norm_in_a_config_file_is_named_as_yaml_reads_it(tmp_path):
    # "takes a value of type str ... got False (a bool)", without saying that YAML reads off as False
    from gwdet.model_zoo import build_config

    config = tmp_path / "off.yaml"
    config.write_text(f'_BASE_: "{DEMO_CONFIG}"\nMODEL:\n  FPN:\n    NORM: off\n')
    with pytest.raises(ValueError) as err:
        build_config(str(config))
    assert str(err.value).endswith(
        "MODEL.FPN.NORM takes a value of type str (it is '' before this value); got False (a bool). YAML reads on, off, "
        "yes, no, true and false unquoted as True or False: quote the text as 'off' in the file, or give \"\" for none "
        "where the key takes a name (NORM: \"\" is no norm).")


def test_a_config_file_with_an_unknown_key_or_given_as_a_folder_is_explained(tmp_path):
    from gwdet.model_zoo import build_config

    config = tmp_path / "mine.yaml"
    config.write_text(f"_BASE_: {DEMO_CONFIG}\nSOLVER:\n  MAX_ITR: 3\n")
    with pytest.raises(ValueError, match=r"mine.yaml' \(or a _BASE_ it names\): SOLVER.MAX_ITR is not a key .* "
                                         r"Did you mean SOLVER.MAX_ITER\?"):
        build_config(str(config))
    with pytest.raises(IsADirectoryError, match="is a folder: give a config file in it"):
        build_config(str(tmp_path))


@pytest.mark.parametrize("opts, world_size, message", [
    (["DATASETS.TRAIN", "()"], 1, "DATASETS.TRAIN is empty: name the dataset(s) to train on"),
    (["SOLVER.MAX_ITER", "0"], 1, "SOLVER.MAX_ITER is 0: a run trains for at least 1 iteration."),
    (["SOLVER.IMS_PER_BATCH", "0"], 1, "SOLVER.IMS_PER_BATCH is 0, which 1 process(es)"),
    (["SOLVER.IMS_PER_BATCH", "3"], 2, "SOLVER.IMS_PER_BATCH is 3, which 2 process(es) (--num-gpus x --num-machines) "
                                       "cannot share evenly: use a positive multiple of 2"),
])
def test_training_values_detectron2_would_assert_on_are_refused_first(opts, world_size, message):
    from gwdet.engine.trainer import check_training_values
    from gwdet.model_zoo import build_config

    cfg = build_config(str(DEMO_CONFIG), opts)
    with pytest.raises(ValueError) as err:
        check_training_values(cfg, world_size)
    assert str(err.value).startswith(message)
    check_training_values(build_config(str(DEMO_CONFIG), ["SOLVER.IMS_PER_BATCH", "4"]), 2)  # 2 images each: fine


def test_a_tilde_the_shell_left_is_the_home_folder_in_the_tools_output_flags_and_refused_where_unread(monkeypatch,
                                                                                                        tmp_path):
    # compare_norms.py --out '~/x' trained into a folder named '~' and said "wrote ~/x/custom/table.md"
    from gwdet.utils.cli_errors import output_path_problem
    from gwdet_lab.benchmark.cli import argument_parser as benchmark_parser
    from gwdet_lab.study.cli import argument_parser as study_parser

    monkeypatch.setenv("HOME", str(tmp_path))
    study = study_parser().parse_args(["--out", "~/x", "--report-to", "~/r", "--export-records", "~/e"])
    assert (study.out, study.report_to, study.export_records) == tuple(str(tmp_path / name) for name in "xre")
    assert benchmark_parser().parse_args(["--out", "~/b.md"]).out == str(tmp_path / "b.md")
    assert output_path_problem("--out", "~/x", folder=True) == (
        f"--out '~/x' begins with '~', a home folder that nothing expanded (a quoted command-line value and a config "
        f"file keep it as it is): the run would write into a folder named '~' here. Let the shell expand it (no quotes "
        f"around ~), or give the path itself (--out={tmp_path / 'x'}); nothing was written.")
    assert output_path_problem("--out", str(tmp_path / "a~b"), folder=True) is None


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _raised(cls):
    """An instance of ``cls`` built through its own constructor: each required argument a value
    of the type it is annotated with (a list or mapping where one is asked)."""
    values = []
    for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if parameter.default is not parameter.empty or parameter.kind not in (parameter.POSITIONAL_ONLY,
                                                                              parameter.POSITIONAL_OR_KEYWORD):
            continue
        annotation = str(parameter.annotation)
        values.append(["first", "second"] if "list" in annotation or "Sequence" in annotation
                      else {"KEY": "value"} if "Mapping" in annotation else f"the {parameter.name}")
    try:
        raise cls(*(values or ["the message"]))
    except cls as error:
        error.extra = "set after the raise"
        return error


# before: NormMismatchError, DamagedFileError, DamagedTensorsError, DamagedExportError and UnsafeCheckpointError
# could not be unpickled (TypeError: missing required positional arguments), so a worker pool lost the message or hung
def test_every_gwdet_error_pickles_with_its_type_message_and_attributes():
    import pickle

    for package in (gwdet, gwdet_lab):
        for _ in _modules(package):
            pass
    classes = set(_subclasses(GwdetError)) | {GwdetError}
    assert len(classes) > 40
    own_reduce = {cls for cls in classes if cls.__reduce__ is not GwdetError.__reduce__}
    assert {cls.__name__ for cls in own_reduce} == {"NormConfigError", "UnknownNormConfigError"}
    for cls in classes:
        error = _raised(cls)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is cls
        if cls in own_reduce:  # its own __reduce__ passes its constructor's arguments: attributes set later are not kept
            del error.extra
        assert (str(copy), copy.args, vars(copy)) == (str(error), error.args, vars(error)), cls


# before: a NormMismatchError raised in a spawned worker broke the ProcessPoolExecutor (BrokenProcessPool)
def test_a_refusal_in_a_worker_process_reaches_the_parent_with_its_message():
    import concurrent.futures
    import multiprocessing

    from gwdet.checkpoint.compatibility import NormMismatchError

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(NormMismatchError, match=r"^the finding; nothing was loaded\. the fix$") as error:
            pool.submit(_raise_norm_mismatch, "the finding", "the fix").result(timeout=120)
    assert error.value.finding == "the finding"


def _raise_norm_mismatch(finding, fix):
    from gwdet.checkpoint.compatibility import NormMismatchError

    raise NormMismatchError(finding, fix)


def test_os_and_import_errors_of_gwdet_keep_their_built_in_values_through_pickle():
    import errno
    import pickle

    from gwdet.errors import GwdetImportError, GwdetOSError

    written = GwdetOSError(errno.ENOSPC, "No space left on device", "/full/disk.pth")
    copy = pickle.loads(pickle.dumps(written))
    assert (copy.errno, copy.strerror, copy.filename, str(copy)) == (errno.ENOSPC, "No space left on device",
                                                                      "/full/disk.pth", str(written))
    missing = pickle.loads(pickle.dumps(GwdetImportError("onnx is not installed: pip install onnx", name="onnx")))
    assert (missing.name, str(missing)) == ("onnx", "onnx is not installed: pip install onnx")
