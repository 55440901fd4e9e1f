"""The analysis tools: the claims they illustrate hold on small sizes, and every subcommand of
tools/analyze.py (gwdet_lab.analysis.cli) writes its pictures and table."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gwdet_lab.analysis.cli import main
from gwdet_lab.analysis.conditioning import condition_number, normalized, simulate_activations
from gwdet_lab.analysis.constraint_report import SMALL_CASES
from gwdet_lab.analysis.report import TABLE_MARK
from gwdet_lab.analysis.constraints import (
    METHODS,
    constraint_number,
    constraint_residuals,
    counting_limit,
    dataset_constraint_number,
    in_counting_range,
    is_solvable,
    numerical_constraint_number,
    solvable_limit,
)
from gwdet_lab.analysis.cost import relative_cost

from gwdet.errors import GwdetTypeError, GwdetValueError

from conftest import DEMO_CONFIG, REPO, TINY_OPTS

GROUPS = (2, 4, 8)


@pytest.fixture(scope="module")
def activations() -> dict:
    """Activations of 1- and 2-layer linear MLPs, d=128 features x m=256 samples."""
    generator = torch.Generator().manual_seed(0)
    return {depth: simulate_activations(depth, 128, 256, "linear", generator) for depth in (1, 2)}


@pytest.mark.parametrize("method", ["GW", "GW_ZCA"])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("p", [0.9, 0.8])
def test_group_whitening_conditions_better_than_group_norm(activations, method, depth, p):
    """GW paper Fig. 2: kappa_p of GW's output is below GN's at every group number g > 1."""
    x = activations[depth]
    for g in GROUPS:
        kappa_gw = condition_number(normalized(x, method, g, T=5), p)
        kappa_gn = condition_number(normalized(x, "GN", g, T=5), p)
        assert kappa_gw < kappa_gn, (g, kappa_gw, kappa_gn)


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("p", [0.9, 0.8])
def test_batch_whitening_condition_number_is_one(activations, depth, p):
    """BW (ZCA, one group of all features) whitens the batch: kappa_p = 1 up to its ridge eps.

    With the ridge, an input eigenvalue lambda becomes lambda / (lambda + eps), so
    1 <= kappa_p <= 1 + eps / lambda_p (lambda_p of the input covariance, same rank).
    """
    x = activations[depth]
    centred = x - x.mean(dim=0)
    input_eigenvalues = torch.linalg.eigvalsh(centred.T @ centred / x.shape[0]).flip(0)
    lambda_p = input_eigenvalues[math.ceil(p * x.shape[1]) - 1].item()
    kappa = condition_number(normalized(x, "BW", 1, T=5), p)
    assert 1.0 - 1e-9 <= kappa <= 1.0 + 1e-5 / lambda_p + 1e-6
    assert kappa == pytest.approx(1.0, abs=1e-2)


def test_condition_number_of_rank_deficient_covariance_is_inf():
    x = torch.randn(64, 8, dtype=torch.float64)
    x[:, 4:] = 0.0
    assert condition_number(x, 0.9) == float("inf")


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_constraint_number_formula_matches_jacobian_rank(case):
    """Table 1's zeta(phi; X) is the rank of the Jacobian of all constraint equations at a point
    satisfying them (the normalizer's output), wherever the system has a solution."""
    method, d, m, g, k = case
    rank, residual = numerical_constraint_number(method, d, m, g, k)
    if is_solvable(method, d, m, g, k):
        assert residual < 1e-6
        assert rank == constraint_number(method, d, m, g, k)
    else:  # inside Table 1's counting range, yet no solution: the normalizer's output misses them
        assert in_counting_range(method, d, m, g, k)
        assert residual > 0.1


def test_every_method_has_a_solvable_numerical_check():
    assert {case[0] for case in SMALL_CASES if is_solvable(*case)} == set(METHODS)


@pytest.mark.parametrize("method, d, m, g", [("BN", 7, 2, 1), ("BW", 5, 4, 1), ("GN", 12, 3, 6), ("GW", 54, 3, 9)])
def test_table1_ranges_are_where_constraints_equal_variables(method, d, m, g):
    """At the boundary of Table 1's range, zeta(phi; X) = md (Eq. 12)."""
    assert counting_limit(method, d) == (m if method in ("BN", "BW") else g)
    assert constraint_number(method, d, m, g) == m * d


def test_relative_cost_formula():
    """2g/(9d) + Tg^3/(9HWd^2) (GW paper Sec. 3)."""
    expected = 2 * 16 / (9 * 64) + 5 * 16**3 / (9 * 7 * 7 * 64**2)
    assert relative_cost(d=64, g=16, height=7, width=7, T=5) == pytest.approx(expected)


SUBCOMMANDS = {
    "conditioning": (
        ["--dim", "32", "--samples", "128", "--groups", "1,2", "--depths", "1", "--activations", "linear"]
        + ["--seeds", "1"],
        ["kappa_90.png", "kappa_80.png", "table.md"],
    ),
    "constraints": (
        ["--d", "16", "--m", "8", "--g", "2", "--N", "64", "--config", str(DEMO_CONFIG), "--input-size", "64x64"],
        ["constraint_density.png", "gw_cost.png", "table.md"],
    ),
    "propagation": (
        ["--config", str(DEMO_CONFIG), "--norms", "GN,GW", *TINY_OPTS, "MODEL.GW.NUM_GROUPS", "4"],
        ["activation_variance.png", "cosine_similarity.png", "gradient_norms.png", "table.md"],
    ),
    "capacity": (["--quick"], ["batch_size.png", "group_number.png", "random_labels.png", "table.md"]),
}


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_subcommand_writes_its_files(tmp_path, command, capsys):
    args, expected = SUBCOMMANDS[command]
    assert main([command, "--out", str(tmp_path), *args]) == 0
    printed = capsys.readouterr().out.splitlines()
    written = [Path(line.strip()) for line in printed[printed.index(f"{command}: wrote") + 1:]]
    folder = tmp_path / command
    assert sorted(p.name for p in written) == sorted(expected)
    for name in expected:
        assert (folder / name).stat().st_size > 0, name
    mark, title = (folder / "table.md").read_text().split("\n", 1)
    assert mark == TABLE_MARK and title.startswith("# ") and "| --- |" in title
    if command == "propagation":  # what produced the numbers: the overrides and the seed (they were not named)
        assert "with `DATASETS.SHAPES.IMAGE_SIZE 64" in title and "MODEL.GW.NUM_GROUPS 4`, seed 0, one batch" in title


@pytest.mark.parametrize("flag, message", [
    (["--groups", "0,2"], "argument --groups: group number must be >= 1, got 0"),
    (["--dim", "0"], "argument --dim: the feature count must be >= 1, got 0"),
    (["--samples", "1"], "argument --samples: the sample count (a covariance needs two samples) must be >= 2, got 1"),
    (["--groups", ","], "argument --groups: give at least one group number"),
    # "make_norm: num_groups=32 must divide num_features=16", an internal function, after the set-up
    (["--groups", "32", "--dim", "16"], "--groups 32: each group number must divide --dim 16"),
    # a repeated value computed and wrote its results twice
    (["--groups", "1,4,1"], "argument --groups: '1,4,1' names 1 more than once: give each once"),
    (["--activations", "relu,relu"], "argument --activations: 'relu,relu' names relu more than once: give each once"),
    # every condition number inf (a singular covariance) without a word about the cause
    (["--dim", "32", "--samples", "32"], "--samples 32 is not more than --dim 32: the covariance of m samples has "
                                         "rank m - 1 at most"),
])
def test_conditioning_refuses_counts_it_cannot_use_before_any_work(tmp_path, capsys, flag, message):
    with pytest.raises(SystemExit) as refused:  # before: raw errors after the simulations had run
        main(["conditioning", "--out", str(tmp_path), *flag])
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "conditioning").exists()


@pytest.mark.parametrize("flags, message", [
    # a table of zeta(phi; D) = N/m = 0.5 batches without a word
    (["constraints", "--m", "100", "--N", "50", "--config", ""], "--m 100 is larger than --N 50"),
    # "k=7 and the group number g=2 must divide d=7": a value of the tool's own sweep; after the figure was written
    (["constraints", "--g", "300", "--config", ""], "--g 300: the group number g of GN/GW and the group size k of BW "
                                                    "split the d features into equal groups, so each must divide --d 256"),
    (["constraints", "--k", "7", "--config", ""], "--k 7: the group number g"),
    (["constraints", "--k", "0", "--config", ""], "argument --k: k must be >= 1, got 0"),
    # the size of a cost table that --config '' does not make, ignored
    (["constraints", "--config", "", "--input-size", "64x64"], "--input-size sets the image of --config's GW cost"),
    # "make_norm: num_groups=3 must divide num_features=32": an internal function's words
    (["capacity", "--quick", "--groups", "3"], "--groups 3: each group number must divide the width of 32 hidden "
                                               "units"),
    (["capacity", "--width", "24"], "--groups 16, 64, 128: each group number must divide --width 24"),
    (["capacity", "--quick", "--width", "6", "--groups", "1,2"], "--width 6: the batch-size sweep's GN and GW use 4 "
                                                                   "groups"),
    # no batch drawn (chance accuracy reported as trained at batch 5000); a table titled with 5000 images of 128
    (["capacity", "--quick", "--batch-sizes", "5000"], "--batch-sizes 5000: the sweeps train on 128 digits images"),
    (["capacity", "--quick", "--random-samples", "5000"], "--random-samples 5000: the sweeps train on 128 digits "
                                                          "images (--quick), so a batch or sample of more than 128"),
])
def test_constraints_and_capacity_refuse_flags_they_cannot_use_before_any_work(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as refused:
        main([*flags, "--out", str(tmp_path)])
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / flags[0]).exists()


def test_a_figure_whose_grouped_curves_are_all_infinite_is_still_written(tmp_path, capsys):
    # d = 8 with 90%: lambda_p is the smallest eigenvalue, which centring each group makes 0 (kappa = inf);
    # the log axes had no finite value and matplotlib raised while laying the figure out
    args = ["--dim", "8", "--samples", "16", "--groups", "1,2", "--depths", "1", "--activations", "linear",
            "--seeds", "1"]
    assert main(["conditioning", "--out", str(tmp_path), *args]) == 0
    table = (tmp_path / "conditioning" / "table.md").read_text()
    assert "| 2 | inf | inf | inf |" in table  # every grouped kappa_90 and kappa_80 at g = 2
    assert (tmp_path / "conditioning" / "kappa_90.png").stat().st_size > 0


@pytest.mark.parametrize("size", ["0x0", "-8x8", "ax2"])
def test_an_input_size_without_positive_sides_is_named_by_the_flag(tmp_path, capsys, size):
    # before: torch's RuntimeError tracebacks from the model run on an empty image
    with pytest.raises(SystemExit) as refused:
        main(["constraints", "--out", str(tmp_path), "--config", str(DEMO_CONFIG), f"--input-size={size}"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"argument --input-size: give HxW with positive whole sides, e.g. 800x1333; got " \
        f"{size!r}" in err


def test_an_input_size_in_analyze_models_two_number_form_is_named_by_the_flag(tmp_path, capsys):
    # "--input-size 128 128" (tools/analyze_model.py's form) was blamed on the KEY VALUE overrides
    with pytest.raises(SystemExit) as refused:
        main(["constraints", "--out", str(tmp_path), "--config", str(DEMO_CONFIG), "--input-size", "128", "128"])
    assert refused.value.code == 2 and ("--input-size takes HxW as one word, e.g. --input-size 128x128; a number after "
                                        "it (128) is read as the start of the KEY VALUE overrides") in capsys.readouterr().err


@pytest.mark.parametrize("percents", ["100", "0", "x"])
def test_percents_outside_the_spectrum_are_named_by_the_flag(tmp_path, capsys, percents):
    # --percents 100 stopped in condition_number with "p must be in (0, 1], got 100.0"
    with pytest.raises(SystemExit) as refused:
        main(["conditioning", "--out", str(tmp_path), "--percents", percents])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "argument --percents: give fractions in (0, 1] of the eigenvalues kept" in err
    assert not (tmp_path / "conditioning").exists()


def test_percents_of_one_label_are_refused_and_a_rerun_removes_the_earlier_figures(tmp_path, capsys):
    # 0.9,0.905: two columns labelled kappa_90%, one kappa_90.png over the other; a rerun with other
    # --percents left the earlier kappa_80.png beside the new table
    with pytest.raises(SystemExit) as refused:
        main(["conditioning", "--out", str(tmp_path), "--percents", "0.9,0.905"])
    assert refused.value.code == 2 and "'0.9,0.905' names 90%, 90%: the tables and figures name each fraction in " \
        "whole percent" in capsys.readouterr().err
    args = ["--dim", "8", "--samples", "16", "--groups", "1,2", "--depths", "1", "--activations", "linear",
            "--seeds", "1"]
    assert main(["conditioning", "--out", str(tmp_path), *args, "--percents", "0.9,0.8"]) == 0
    assert main(["conditioning", "--out", str(tmp_path), *args, "--percents", "0.7"]) == 0
    assert sorted(path.name for path in (tmp_path / "conditioning").glob("*.png")) == ["kappa_70.png"]
    assert "removed the earlier run's figures kappa_80.png, kappa_90.png" in capsys.readouterr().out


def test_a_table_the_tool_did_not_write_is_never_replaced(tmp_path, capsys):
    # an earlier table.md of the user's in <out>/conditioning was replaced without a word
    args = ["--dim", "8", "--samples", "16", "--groups", "1,2", "--depths", "1", "--activations", "linear",
            "--seeds", "1"]
    assert main(["conditioning", "--out", str(tmp_path), *args]) == 0
    assert main(["conditioning", "--out", str(tmp_path), *args]) == 0  # its own table: replaced
    notes = tmp_path / "conditioning" / "table.md"
    notes.write_text("# my notes\n")
    with pytest.raises(SystemExit) as refused:
        main(["conditioning", "--out", str(tmp_path), *args])
    assert refused.value.code == 2 and f"{notes} was not written by tools/analyze.py" in capsys.readouterr().err
    assert notes.read_text() == "# my notes\n"
    notes.unlink()  # the user's figure beside no table of the tool's: replaced without a word before
    (tmp_path / "conditioning" / "kappa_90.png").write_bytes(b"my figure")
    with pytest.raises(SystemExit) as refused:
        main(["conditioning", "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"{tmp_path / 'conditioning'} holds " in err and "kappa_90.png" in err
    assert "but no table.md of tools/analyze.py, so none of it was written by the tool" in err
    assert (tmp_path / "conditioning" / "kappa_90.png").read_bytes() == b"my figure"


def test_a_run_stopped_before_its_table_leaves_a_folder_that_says_so_and_that_it_writes_again(tmp_path, capsys):
    # Ctrl-C after the first figure: the rerun its stop line advised was refused ("none of it was written by the
    # tool"); over an earlier run, the new figure sat beside the old table without a mark
    from gwdet_lab.analysis.report import UNFINISHED, output_folder

    folder = output_folder(tmp_path, "conditioning")  # as a run does before it measures, then stopped
    (folder / "kappa_90.png").write_bytes(b"a figure of the stopped run")
    assert (folder / "table.md").read_text().split("\n")[:2] == [TABLE_MARK, f"{UNFINISHED} (run the subcommand again)."]
    args = ["--dim", "8", "--samples", "16", "--groups", "1,2", "--depths", "1", "--activations", "linear",
            "--seeds", "1"]
    assert main(["conditioning", "--out", str(tmp_path), *args]) == 0
    assert UNFINISHED not in (folder / "table.md").read_text()
    assert (folder / "kappa_90.png").read_bytes() != b"a figure of the stopped run"


def test_tool_is_the_cli_entry_point(capsys):
    """tools/analyze.py runs gwdet_lab.analysis.cli: its subcommands, and argparse's exit codes."""
    tool = [sys.executable, str(REPO / "tools" / "analyze.py")]
    shown = subprocess.run([*tool, "--help"], capture_output=True, text=True, cwd=REPO, check=False)
    assert shown.returncode == 0 and "{conditioning,constraints,propagation,capacity}" in shown.stdout
    with pytest.raises(SystemExit) as refused:  # the same main, in this process
        main(["nonsense"])
    assert refused.value.code == 2 and "invalid choice: 'nonsense'" in capsys.readouterr().err


@pytest.mark.parametrize("command, flag, message", [
    # raw numpy / sklearn / torch tracebacks, or a constant table from --lr nan
    ("propagation", ["--seed", "-1"], "argument --seed: --seed must be >= 0, got -1"),
    # seven findings about config NORM keys the user never set, --norms never named
    ("propagation", ["--norms", "GW,XX"], "--norms GW,XX: 'XX' is no norm name; give names of "),
    ("capacity", ["--lr", "nan"], "argument --lr: --lr must be a finite number > 0, got nan"),
    ("capacity", ["--lr", "-0.1"], "argument --lr: --lr must be a finite number > 0, got -0.1"),
    ("capacity", ["--threads", "-1"], "argument --threads: --threads must be >= 1, got -1"),
])
def test_analysis_flags_out_of_range_are_refused_before_any_work(tmp_path, capsys, command, flag, message):
    with pytest.raises(SystemExit) as refused:
        main([command, "--out", str(tmp_path), *flag])
    assert refused.value.code == 2 and message in capsys.readouterr().err


def test_a_figure_that_does_not_fit_on_the_disk_is_one_error_and_no_cut_file(tmp_path):
    # a full disk stopped the tool with PIL's traceback and left a cut-short PNG beside the table
    import resource

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))  # the table fits, a figure does not

    args = ["--dim", "8", "--samples", "16", "--groups", "1,2", "--depths", "1", "--activations", "linear",
            "--seeds", "1", "--percents", "0.9"]
    done = subprocess.run([sys.executable, "tools/analyze.py", "conditioning", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, preexec_fn=small_files, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert f"cannot write {tmp_path / 'conditioning' / 'kappa_90.png'}: File too large" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "conditioning").glob("*.png")) and not list((tmp_path / "conditioning").glob(".*"))


# before: each was accepted and the last value used without a word (--out an/o2 written, d=256, GW columns only)
@pytest.mark.parametrize("flags, message", [
    (["constraints", "--config", "", "--out", "OUT1", "--out", "OUT2"],
     "constraints: error: --out is given more than once; a second one would replace the first. Give it "
     "once, with the value you mean (given: OUT1, OUT2)."),
    (["constraints", "--config", "", "--d", "128", "--d", "256"],
     "--d is given more than once; a second one would replace the first. Give it once, with the value you mean "
     "(given: 128, 256)."),
    (["propagation", "--norms", "GN", "--norms", "GW"],
     "--norms is given more than once; a second one would replace the first. Give it once, with the value you mean "
     "(given: GN, GW)."),
])
def test_a_flag_given_twice_is_refused_by_the_subcommand(tmp_path, capsys, flags, message):
    flags = [str(tmp_path / word) if word.startswith("OUT") else word for word in flags]
    message = message.replace("OUT1", str(tmp_path / "OUT1")).replace("OUT2", str(tmp_path / "OUT2"))
    if "--out" not in flags:
        flags += ["--out", str(tmp_path)]
    with pytest.raises(SystemExit) as refused:
        main(flags)
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not any(tmp_path.rglob("table.md"))


# before: the table said "with `MODEL.GW.NUM_GROUPS 7`" alone, while every GW layer used 4 groups
def test_propagation_names_the_group_number_its_layers_used(tmp_path):
    args = ["--config", str(DEMO_CONFIG), "--norms", "GW", *TINY_OPTS, "MODEL.GW.NUM_GROUPS", "7"]
    assert main(["propagation", "--out", str(tmp_path), *args]) == 0
    table = (tmp_path / "propagation" / "table.md").read_text()
    assert "MODEL.GW.NUM_GROUPS 7`, seed 0" in table
    assert ("Group numbers that do not divide the layers' channels were adjusted, and the table measures what the "
            "layers use: GW: 69 GroupWhitening layer(s) asked for 7 groups use 4.") in table


# before: the cost table was computed with T 1 and 4 groups, but named the config file alone
def test_the_gw_cost_table_names_the_overrides_and_the_t_it_was_computed_with(tmp_path):
    args = ["--config", str(DEMO_CONFIG), "--input-size", "64x64", "MODEL.GW.T", "1", "MODEL.GW.NUM_GROUPS", "7"]
    assert main(["constraints", "--out", str(tmp_path), *args]) == 0
    table = (tmp_path / "constraints" / "table.md").read_text()
    assert ("_gw_shapes.yaml` with `MODEL.GW.T 1 MODEL.GW.NUM_GROUPS 7`, input 64x64, T = 1 (Newton iterations). "
            "Relative cost") in table
    assert ("Group numbers that do not divide the layers' channels were adjusted, and the g column is what the layers "
            "use: 33 GroupWhitening layer(s) asked for 7 groups use 4.") in table
    assert "| 0 | `backbone.bottom_up.stem.conv1.norm` | itn | 16 | 4 | 32 | 32 | 0.05556 | 2.713e-05 |" in table


# before: accepted by the argument check, then the GW layer's message about MODEL.GW.NUM_GROUPS and image sizes
@pytest.mark.parametrize("flags, message", [
    (["conditioning", "--dim", "16", "--samples", "64", "--groups", "1,16"],
     "--groups 16: one feature per group with --dim 16, which GN and GW normalize to 0 for any input"),
    (["capacity", "--quick", "--width", "16", "--groups", "1,16"],
     "--groups 16: one unit per group with --width 16, which GN and GW normalize to 0 for any input"),
    (["capacity", "--quick", "--width", "4", "--groups", "1,2"],
     "--width 4: the batch-size sweep's GN and GW use 4 groups, one unit per group"),
])
def test_one_feature_per_group_is_refused_with_the_tools_flags(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as refused:
        main([*flags, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and message in err and "MODEL.GW" not in err
    assert not (tmp_path / flags[0]).exists()


# tools/analyze_model.py --tasks structure --max-depth 2 printed the whole model (6 levels), the depth ignored
def test_analyze_models_structure_stops_at_the_given_max_depth(capsys):
    from gwdet.export import analyze_model

    base = ["--config-file", str(DEMO_CONFIG), "--tasks", "structure", *TINY_OPTS, "MODEL.WEIGHTS", "", "MODEL.DEVICE", "cpu"]
    assert analyze_model.main(base[:4] + ["--max-depth", "2"] + base[4:]) == 0
    printed = capsys.readouterr().out
    assert "Model:\n" not in printed  # the whole model that building it logs is left out
    folded = printed.split("Model structure:\n", 1)[1]
    assert "    (bottom_up): ResNet(... " in folded and "(res2)" not in folded
    assert max(len(line) - len(line.lstrip()) for line in folded.splitlines()) == 4  # the model, then 2 levels
    assert analyze_model.main(base) == 0  # without --max-depth: every level, as str(model) prints it
    whole = capsys.readouterr().out.split("Model structure:\n", 1)[1]
    assert "(res2): Sequential(" in whole and "Conv2d(" in whole


def test_structure_text_of_every_level_is_the_modules_repr():
    from gwdet.export.analyze_model import structure_text

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 3)))
    assert structure_text(model, None) == repr(model) == structure_text(model, 5)
    assert structure_text(model, 1) == ("Sequential(\n  (0): Conv2d(3, 4, kernel_size=(3, 3), stride=(1, 1))\n"
                                        "  (1): Sequential(... 2 modules inside)\n)")


# --tasks parameter with MODEL.WEIGHTS of a file that is not there: the weights were left unread without a word (the
# line saying so was logged at info level, which the tool does not show)
def test_weights_the_analyze_tool_does_not_read_are_named_in_a_warning(tmp_path, capsys):
    from conftest import logged_warnings
    from gwdet.export import analyze_model

    missing = tmp_path / "nonexistent.pth"
    with logged_warnings("gwdet.engine.run") as warned:
        assert analyze_model.main(["--config-file", str(DEMO_CONFIG), "--tasks", "parameter", *TINY_OPTS,
                                   "MODEL.WEIGHTS", str(missing), "MODEL.DEVICE", "cpu"]) == 0
    assert warned == [f"MODEL.WEIGHTS {missing} is not read (nor checked): what is asked does not depend on weights."]


# --out and --seed after the KEY VALUE overrides were read as config keys: "--out is not a key of detectron2's or
# gwdet's config", "--seed ... did you mean SEED?"
def test_flags_after_the_overrides_are_read_as_flags(tmp_path, capsys):
    args = ["--config", str(DEMO_CONFIG), "--norms", "GW", *TINY_OPTS, "MODEL.GW.NUM_GROUPS", "4"]
    assert main(["propagation", *args, "--seed", "1", "--out", str(tmp_path / "p")]) == 0
    table = (tmp_path / "p" / "propagation" / "table.md").read_text()
    assert "MODEL.GW.NUM_GROUPS 4`, seed 1, one batch" in table and "--out" not in table
    assert main(["constraints", "--config", str(DEMO_CONFIG), "--input-size", "64x64", "MODEL.GW.NUM_GROUPS", "4",
                 "--out", str(tmp_path / "c")]) == 0
    assert "_gw_shapes.yaml` with `MODEL.GW.NUM_GROUPS 4`, input 64x64" in (
        tmp_path / "c" / "constraints" / "table.md").read_text()
    with pytest.raises(SystemExit):  # an unknown flag among the overrides is a usage error, not a config key
        main(["constraints", "--config", str(DEMO_CONFIG), "MODEL.GW.NUM_GROUPS", "4", "--outt", str(tmp_path)])
    assert "constraints: error: unknown flag '--outt'" in capsys.readouterr().err


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


# before: the refusal came after the finished table.md had been replaced by the "# Unfinished: ..." stub
def test_a_refused_capacity_run_leaves_the_finished_run_as_it_was(tmp_path, capsys):
    assert main(["capacity", "--out", str(tmp_path), "--quick"]) == 0
    finished = _files(tmp_path / "capacity")
    for flags, message in [
        (["--batch-norms", "XYZ"], "batch-size sweep: unknown norms ['XYZ']; choose from BN, BW, GN, GW"),
        (["--random-samples", "8"], "--random-samples 8: the random-label sweep trains on batches of 16 images"),
    ]:
        with pytest.raises(SystemExit) as refused:
            main(["capacity", "--out", str(tmp_path), "--quick", *flags])
        assert refused.value.code == 2 and message in capsys.readouterr().err
        assert _files(tmp_path / "capacity") == finished


# before: the refusal came after the finished table.md had been replaced by the "# Unfinished: ..." stub
def test_a_refused_conditioning_run_leaves_the_finished_run_as_it_was(tmp_path, capsys):
    args = ["--dim", "8", "--samples", "16", "--groups", "1,2", "--depths", "1", "--activations", "linear",
            "--seeds", "1"]
    assert main(["conditioning", "--out", str(tmp_path), *args]) == 0
    finished = _files(tmp_path / "conditioning")
    with pytest.raises(SystemExit) as refused:
        main(["conditioning", "--out", str(tmp_path), *[("foo" if value == "linear" else value) for value in args]])
    assert refused.value.code == 2 and "unknown activation 'foo'; choose from relu, linear, tanh" in capsys.readouterr().err
    assert _files(tmp_path / "conditioning") == finished


# before: each refusal left <out>/<subcommand>/table.md, the "# Unfinished: ..." stub, in an empty --out;
# --random-samples 8 reported the untrained MLP's accuracy, and --width 50 with BW stopped in make_norm
@pytest.mark.parametrize("flags, message", [
    (["capacity", "--quick", "--batch-norms", "XYZ"], "batch-size sweep: unknown norms ['XYZ']"),
    (["capacity", "--quick", "--random-samples", "8"], "--random-samples 8: the random-label sweep trains on batches "
                                                       "of 16 images, so with fewer images no batch is drawn"),
    (["capacity", "--quick", "--width", "50", "--groups", "1,2", "--batch-norms", "BN,BW"],
     "--width 50: the batch-size sweep's BW whitens groups of about 16 units (BW-C16), 3 groups here, which must "
     "divide it; give a --width that is a multiple of 16"),
    (["conditioning", "--dim", "8", "--samples", "16", "--groups", "1,2", "--activations", "foo"],
     "unknown activation 'foo'; choose from relu, linear, tanh"),
    (["propagation", "--config", "no_such_config.yaml", "--norms", "GN"], "no_such_config.yaml"),
])
def test_a_refused_analysis_writes_nothing_into_an_empty_out(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as refused:
        main([*flags, "--out", str(tmp_path / "out")])
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# Before: "--input-size 64.5 64" got the hint "(a config override: give the width before it)", as any value with a '.'.
@pytest.mark.parametrize("side, hint", [
    ("64.5", "(64.5 has a fraction, and an image's sides are whole pixels: give an integer, e.g. 64)"),
    ("64.0", "(64.0 is a whole number not written as an integer: give it as 64)"),
    ("MODEL.WEIGHTS", "(a config override: give the width before it)"),
])
def test_analyze_models_input_size_names_a_fraction_apart_from_a_config_override(capsys, side, hint):
    from gwdet.export import analyze_model

    with pytest.raises(SystemExit) as exit_info:
        analyze_model.argument_parser().parse_args(["--config-file", str(DEMO_CONFIG), "--input-size", side, "64"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"got {side!r} {hint}" in err
    assert side == "MODEL.WEIGHTS" or "config override" not in err


# Before: ZeroDivisionError (g=0, d=0, m=0), "math domain error" (d=-5), -56 for m=-4 and True for g=2.5, no word.
@pytest.mark.parametrize("call, message", [
    (lambda: constraint_number("GW", 16, 4, g=0), "constraint_number: g must be an integer >= 1, got 0"),
    (lambda: constraint_number("BN", 0, 4), "constraint_number: d must be an integer >= 1, got 0"),
    (lambda: constraint_number("GW", 16, -4, g=4), "constraint_number: m must be an integer >= 1, got -4"),
    (lambda: counting_limit("GW", -5), "counting_limit: d must be an integer >= 1, got -5"),
    (lambda: dataset_constraint_number("GW", 16, 0, 100, g=4), "dataset_constraint_number: m must be an integer >= 1, "
                                                               "got 0"),
    (lambda: dataset_constraint_number("GW", 16, 4, 0, g=4), "dataset_constraint_number: N must be an integer >= 1"),
    (lambda: is_solvable("GW", 16, 4, g=2.5), "is_solvable: g must be an integer >= 1, got 2.5 (float)"),
    (lambda: is_solvable("GW", 16, 4, g=3), "is_solvable: g=3 must divide d=16 (the group number of GN/GW: the d "
                                            "features are split into g equal groups); give a divisor of d such as 2 "
                                            "or 4"),
    (lambda: in_counting_range("GN", 16, 4, g=32), "in_counting_range: g=32 must divide d=16 (the group number of "
                                                   "GN/GW: the d features are split into g equal groups); give a "
                                                   "divisor of d such as 16,"),
    (lambda: solvable_limit("BW", 16, k=5), "solvable_limit: k=5 must divide d=16 (the group size of BW: the d "
                                            "features are whitened in groups of k); give a divisor of d such as 4 or 8"),
    (lambda: numerical_constraint_number("GN", 6, 0, 2), "numerical_constraint_number: m must be an integer >= 1"),
    (lambda: constraint_residuals("GW", torch.zeros(4, 16), g=5), "constraint_residuals: g=5 must divide d=16"),
])
def test_constraint_functions_refuse_sizes_that_are_not_counts(call, message):
    with pytest.raises(GwdetValueError, match="^" + re.escape(message)):
        call()


# Before: relative_cost(16, 3, 8, 8, 5) gave 0.02805, the cost at g=2, against its docstring's formula at g=3.
def test_relative_cost_refuses_a_group_number_that_does_not_divide_d():
    with pytest.raises(GwdetValueError, match=re.escape("relative_cost: g=3 must divide d=16 (the group number of "
                                                        "GN/GW: the d features are split into g equal groups); give a "
                                                        "divisor of d such as 2 or 4, or another d")):
        relative_cost(16, 3, 8, 8, 5)


# Before: conv3x3_macs's message about a shape (1, 0, 8, 8) the caller did not give.
@pytest.mark.parametrize("args, message", [
    ((0, 4, 8, 8, 5), "relative_cost: d must be an integer >= 1, got 0"),
    ((16, 4, 0, 8, 5), "relative_cost: height must be an integer >= 1, got 0"),
    ((16, 4, 8, 8, 0), "relative_cost: T must be an integer >= 1, got 0"),
])
def test_relative_cost_names_its_own_bad_size(args, message):
    with pytest.raises(GwdetValueError, match="^" + re.escape(message)):
        relative_cost(*args)


# Before: torch's LinAlgError "linalg.eigh: The algorithm failed to converge" on an all-NaN input.
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_condition_number_refuses_values_that_are_not_finite(value):
    x = torch.randn(100, 8, dtype=torch.float64)
    x[3, 2] = value
    with pytest.raises(GwdetValueError, match=re.escape("condition_number: x holds NaN or inf values (1 of 800), so "
                                                        "its covariance and condition number are undefined")):
        condition_number(x, 1.0)


# before: "RuntimeError: mean(): could not infer output dtype ... Got: Long" (an integer tensor), and the same
# from a bool or complex tensor's covariance
@pytest.mark.parametrize("x, dtype", [(torch.randint(0, 5, (50, 4)), "torch.int64"),
                                      (torch.ones(50, 4, dtype=torch.bool), "torch.bool"),
                                      (torch.randn(50, 4, dtype=torch.complex64), "torch.complex64")])
def test_condition_number_refuses_a_tensor_that_is_not_floating_point(x, dtype):
    with pytest.raises(GwdetValueError, match="^" + re.escape(
            f"condition_number: x must be a float16, bfloat16, float32 or float64 tensor, got {dtype}; convert it "
            "with x.double() (or x.float())")):
        condition_number(x, 1.0)


# before: "AttributeError: 'numpy.ndarray' object has no attribute 'dim'"; p=True was taken as p = 1
def test_condition_number_refuses_an_array_and_a_bool_p():
    import numpy as np

    with pytest.raises(GwdetTypeError, match="^" + re.escape(
            "condition_number: x must be a torch.Tensor of shape (m, d), got a value of type numpy.ndarray; convert it "
            "with torch.as_tensor(x).double()")):
        condition_number(np.random.default_rng(0).standard_normal((200, 16)), 1.0)
    with pytest.raises(GwdetValueError, match="^" + re.escape(
            "condition_number: p must be a number in (0, 1], the fraction of the eigenvalues up to lambda_p, got "
            "True (bool)")):
        condition_number(torch.randn(200, 16, dtype=torch.float64), True)


# before: "NotImplementedError: "linalg_eigh_cpu" not implemented for 'Half'" (and 'BFloat16')
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_condition_number_of_half_precision_activations_is_numpys_on_the_same_values(dtype):
    import numpy as np

    x = simulate_activations(1, 64, 256, "relu", torch.Generator().manual_seed(0)).to(dtype)
    values = x.double().numpy()
    centred = values - values.mean(axis=0)
    eigenvalues = np.linalg.eigvalsh(centred.T @ centred / values.shape[0])[::-1]
    for p in (1.0, 0.9, 0.5):
        assert condition_number(x, p) == pytest.approx(eigenvalues[0] / eigenvalues[math.ceil(p * 64) - 1], rel=1e-9)
    # GN's output has rank d - g: rounded to half precision, the g zero eigenvalues stay within the rounding
    y = normalized(simulate_activations(1, 64, 256, "relu", torch.Generator().manual_seed(0)), "GN", 8, T=5)
    assert condition_number(y.to(dtype), 0.9) == condition_number(y, 0.9) == float("inf")
    assert condition_number(y.to(dtype), 0.8) == pytest.approx(condition_number(y, 0.8), rel=2e-3)


# Before: train_samples=-5 kept all but the last 5 images (slice(-5)), 2.5 stopped in slicing, and val_fraction 1.0 or
# -0.5 in sklearn's words about test_size.
@pytest.mark.parametrize("kwargs, message", [
    ({"train_samples": -5}, "load_digits_split: train_samples must be an integer >= 1, got -5"),
    ({"train_samples": 2.5}, "load_digits_split: train_samples must be an integer >= 1, got 2.5 (float)"),
    ({"val_fraction": 1.0}, "load_digits_split: val_fraction must be a number in (0, 1), the share of the images held "
                            "out for validation, got 1.0"),
    ({"val_fraction": -0.5}, "load_digits_split: val_fraction must be a number in (0, 1)"),
    ({"seed": -1}, "load_digits_split: seed must be an integer >= 0, got -1"),
])
def test_load_digits_split_refuses_bad_arguments_before_loading(monkeypatch, kwargs, message):
    import sklearn.datasets

    from gwdet_lab.analysis.capacity import load_digits_split

    def not_loaded():
        raise AssertionError("the digits were loaded before the arguments were checked")

    monkeypatch.setattr(sklearn.datasets, "load_digits", not_loaded)
    with pytest.raises(GwdetValueError, match="^" + re.escape(message)):
        load_digits_split(**kwargs)
