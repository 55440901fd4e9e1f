"""The study's committed reports regenerate from its committed records, and the statistics of the
six orderings: Holm's adjustment, the interval with the test images' noise, equivalence by TOST."""
from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import pytest

from gwdet_lab.study.cells import PAPER_AP, PAPER_ORDERINGS
from gwdet_lab.study.cli import main, report_from_records
from gwdet.utils.atomic import write_text_with_checksum
from gwdet_lab.study.record import (code_label, code_note, confounded_note, read_record, running_code_label,
                                    write_usage)
from gwdet_lab.study.records import export_records, recorded_cells
from gwdet_lab.study.run_folder import RunFolder
from gwdet_lab.study.stats import holm_adjusted, paired_difference, t_quantile, with_holm

from conftest import REPO

RECORDS = REPO / "docs" / "study" / "records"
REPORTED_FILES = ("table.md", "table.csv", "differences.csv", "cells.csv")


def test_the_six_orderings_are_every_pair_ordered_by_the_papers_numbers():
    assert len(PAPER_ORDERINGS) == 6 and len(set(PAPER_ORDERINGS)) == 6
    assert all(PAPER_AP[better] > PAPER_AP[worse] for better, worse in PAPER_ORDERINGS)
    assert ("bn_gw_s1b2", "gn") in PAPER_ORDERINGS and ("gw", "bn") in PAPER_ORDERINGS


def test_a_committed_report_regenerates_byte_for_byte_from_its_records(tmp_path):
    """The command docs/study/README.md gives, in process, into a fresh folder."""
    name = "paper-seeds-3-4"
    code = main(["--study", "paper", "--records", str(RECORDS / name), "--report-to", str(tmp_path / name)])
    assert code == 0
    for file in REPORTED_FILES:
        assert (tmp_path / name / file).read_text() == (REPO / "docs" / "study" / name / file).read_text(), file


def test_example_weights_other_than_the_records_swept_are_refused(tmp_path, capsys):
    # the report showed the records' choice among 0, 0.1, 0.25, 0.5, 1: --example-weights 0.5 was ignored
    only = ["--only", "bn-b2-s0", "gw-b2-s0"]
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(RECORDS / "paper"), *only, "--example-weights", "0.5",
              "--report-to", str(tmp_path / "half")])
    assert ("--example-weights 0.5: the records chose their example weight on val among other weights (bn-b2-s0 (0, "
            "0.1, 0.25, 0.5, 1)), and the report shows that choice") in capsys.readouterr().err
    assert not (tmp_path / "half").exists()
    assert main(["--study", "paper", "--records", str(RECORDS / "paper"), *only, "--example-weights", "1",
                 "0.5", "0.25", "0.1", "0", "--report-to", str(tmp_path / "same")]) == 0  # the records' own sweep


def test_a_trained_cell_whose_example_weighing_is_pending_is_listed_as_such(capsys):
    # --list called it "interrupted", although it had trained and been evaluated
    from gwdet_lab.study.cli import list_cells

    planned = recorded_cells(RECORDS / "paper", ["bn-b2-s0"])
    list_cells(planned, [0.3])
    assert capsys.readouterr().out.split()[:2] == ["bn-b2-s0", "to"]
    list_cells(planned, [0.5, 0.25])  # swept, and the recorded choice (0.25) is among them
    assert capsys.readouterr().out.split()[:2] == ["bn-b2-s0", "done"]
    # a subset without the recorded choice was "done": the report showed 0.25, a weight not asked for
    list_cells(planned, [0.5, 1])
    assert capsys.readouterr().out.split()[:2] == ["bn-b2-s0", "to"]


def test_a_report_folder_of_the_users_own_files_is_refused_and_an_earlier_report_replaced(tmp_path, capsys):
    # --report-to replaced a user's table.md and figures without a word
    name = "paper-seeds-3-4"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "table.md").write_text("my own notes")
    (mine / "ap_bars.png").write_text("x")
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(RECORDS / name), "--report-to", str(mine)])
    assert "--report-to " + str(mine) + " holds table.md, ap_bars.png, which the report would replace" in \
        capsys.readouterr().err
    assert (mine / "table.md").read_text() == "my own notes"
    report = tmp_path / "report"
    for _ in range(2):  # a report of the tool is replaced
        assert main(["--study", "paper", "--records", str(RECORDS / name), "--report-to", str(report)]) == 0
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(RECORDS / name), "--report-to", str(tmp_path / "file")])
    assert "is a file, not a folder" in capsys.readouterr().err


def test_records_export_and_read_back_to_the_same_report(tmp_path):
    source = recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3", "gn-b2-s3"])
    assert [p.cell.name for p in source] == ["gn-b2-s3", "gw-b2-s3"]  # paper order within a seed
    assert source[0].cell.config_file == "configs/Study/gn.yaml"  # relative to the checkout it trained in
    exported = export_records(source, tmp_path / "copy")
    assert sorted(p.name for p in exported) == ["gn-b2-s3", "gw-b2-s3"]
    for cell in exported:
        assert (cell / "inference" / "shapes_test" / "coco_instances_results.json.gz").is_file()
        original = RECORDS / "paper-seeds-3-4" / cell.name
        assert json.loads((cell / "results.json").read_text()) == json.loads((original / "results.json").read_text())
    args = argparse.Namespace(study="paper", only=None, opts=[], report_to=str(tmp_path / "report"),
                              export_records=None, example_weights=None)
    assert report_from_records(args, tmp_path / "copy", [], tmp_path) == 0
    table = (tmp_path / "report" / "table.md").read_text()
    assert "| GW > GN | 2 | +0.60 | 1 | +0.36 |" in table  # one paired seed: no interval, no verdict


def test_records_of_an_unfinished_cell_or_a_missing_folder_are_refused(tmp_path, capsys):
    shutil.copytree(RECORDS / "paper-seeds-3-4" / "gw-b2-s3", tmp_path / "records" / "gw-b2-s3")
    (tmp_path / "records" / "gw-b2-s3" / "study_complete.json").unlink()
    for records, message in ((tmp_path / "records", "gw-b2-s3 not finished in the records"),
                             (tmp_path / "none", "no such folder")):
        with pytest.raises(SystemExit) as exit_:
            main(["--study", "paper", "--records", str(records), "--out", str(tmp_path)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(ValueError, match="no record of gn-b2-s9"):
        recorded_cells(tmp_path / "records", ["gn-b2-s9"])
    # one cell's own folder given as the records: "no cell records in it (folders with study_cell.json)", though it holds one
    with pytest.raises(FileNotFoundError, match=r"no cell records in it \(folders with study_cell.json\): it is the "
                                                r"record of one cell itself; give the folder that holds it, --records "
                                                r".*records --only gw-b2-s3$"):
        recorded_cells(tmp_path / "records" / "gw-b2-s3")


def test_records_missing_a_file_the_report_reads_are_refused_naming_it(tmp_path, capsys):
    # without metrics.json the report was written without a word (final loss "–", no curve); without results.json
    # it blamed study_complete.json, which was there, and did not say to export again
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    for name in ("metrics.json", "metrics.json.sha256"):
        (records / "gw-b2-s3" / name).unlink()
    for name in ("results.json", "results.json.sha256"):
        (records / "gn-b2-s3" / name).unlink()
    with pytest.raises(SystemExit) as exit_:
        main(["--records", str(records), "--report-to", str(tmp_path / "report")])
    assert exit_.value.code == 2
    assert (f"--records {records}: gn-b2-s3 not finished in the records (no results.json); gw-b2-s3 not finished in "
            "the records (no metrics.json): a copy or export cut short, or records of a cell that had not finished. "
            "Export the finished cells again (the study's command with --report-only --export-records DIR)") \
        in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


def _one_image_bootstrap(tmp_path):
    """Resampled APs of one detection on a dataset of one image."""
    from gwdet_lab.study.image_bootstrap import resampled_box_ap

    annotations = {"images": [{"id": 1, "width": 64, "height": 64}], "categories": [{"id": 1, "name": "box"}],
                   "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20], "area": 400,
                                    "iscrowd": 0}]}
    detections = tmp_path / "inference" / "one" / "coco_instances_results.json"
    detections.parent.mkdir(parents=True)
    detections.write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20], "score": 0.9}]))
    return resampled_box_ap(tmp_path / "inference", "one", annotations, tmp_path / "cache.json", 100.0)


def test_a_report_split_of_one_image_claims_no_test_image_noise_and_no_equivalence(tmp_path):
    # one test image: "SE over test images 0.00" and "within ±1 AP (TOST): yes" from resamples that cannot vary
    import dataclasses

    from gwdet_lab.study.report import differences, few_test_images_note, grouped
    from gwdet_lab.study.summary import summarize

    assert _one_image_bootstrap(tmp_path) == []
    results = [dataclasses.replace(summarize(p), test_ap_resampled=[])
               for p in recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3", "gn-b2-s3", "gw-b2-s4", "gn-b2-s4"])]
    (found,) = [d for _, d in differences(grouped(results))]
    assert found.n == 2 and found.interval(0.9) is not None  # the seeds' interval stands
    assert found.equivalent() is None and found.with_image_noise is None and results[0].test_ap_image_se is None
    assert few_test_images_note(results).startswith(
        "The report split of gn-b2-s3, gw-b2-s3, gn-b2-s4, gw-b2-s4 holds fewer than 2 images: every bootstrap "
        "resample of one image is that image, so the test images' noise cannot be estimated.")


def test_a_report_folder_is_held_while_it_is_checked_and_written(tmp_path, monkeypatch):
    # two reports into one new folder at once both said "wrote": the second replaced the first without a word
    from gwdet.engine.output_dir import folder_locked
    from gwdet_lab.study import cli, report as study_report

    folder = tmp_path / "report"
    held = []
    checked = cli.reported_cells
    written = study_report._write_report_files
    monkeypatch.setattr(cli, "reported_cells", lambda path: held.append(("check", folder_locked(str(path))))
                        or checked(path))
    monkeypatch.setattr(study_report, "_write_report_files", lambda title, results, pending, out_dir, notes: held.append(
        ("write", folder_locked(str(out_dir)))) or written(title, results, pending, out_dir, notes))
    assert main(["--records", str(_record_copy(tmp_path)), "--report-to", str(folder)]) == 0
    assert held == [("check", False), ("check", True), ("write", True)]  # checked early, then again when held


def test_a_report_stopped_while_its_files_are_written_leaves_the_earlier_report(tmp_path, monkeypatch):
    # a report killed after table.md left the new table beside the old figures, nothing marking the folder
    from gwdet_lab.study import report as study_report
    from gwdet_lab.study.cli import TITLES
    from gwdet_lab.study.summary import summarize

    folder = tmp_path / "report"
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    assert main(["--records", str(records), "--report-to", str(folder)]) == 0

    def stopped(results, path):
        raise KeyboardInterrupt

    earlier = {path.name: path.read_bytes() for path in folder.iterdir()}
    monkeypatch.setattr(study_report, "plot_loss_curves", stopped)
    with pytest.raises(KeyboardInterrupt):
        study_report.write_report(TITLES["custom"], [summarize(p) for p in recorded_cells(records, ["gw-b2-s3"])], [],
                                  folder)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == earlier  # no temporary file left either
    monkeypatch.undo()
    assert main(["--records", str(records), "--report-to", str(folder)]) == 0  # the same command writes it again
    assert study_report.UNFINISHED not in (folder / "table.md").read_text()


def _record_copy(tmp_path, cells=("gw-b2-s3",)):
    for cell in cells:
        shutil.copytree(RECORDS / "paper-seeds-3-4" / cell, tmp_path / "records" / cell)
    return tmp_path / "records"


def test_a_damaged_record_is_to_be_copied_again_not_trained_anew(tmp_path, capsys):
    # an export cut short by a full disk left a 0-byte study_cell.json; the advice was to run the same
    # command again so that "the cell resumes from its last checkpoint", which a records folder has not
    records = _record_copy(tmp_path)
    (records / "gw-b2-s3" / "study_cell.json").write_bytes(b"")
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(records), "--report-to", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert f"{records / 'gw-b2-s3' / 'study_cell.json'} is damaged" in err
    assert "Records are only read, never trained into: copy the cell's records again" in err
    assert "resumes from its last checkpoint" not in err


def test_records_with_flags_of_a_training_or_another_studys_title_are_refused(tmp_path, capsys):
    # --opts, --configs and --study batch-sweep were taken with records they did not describe:
    # "Common overrides of every cell: ..." and a custom study titled as the batch sweep
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    for flags, message in ((["--opts", "SOLVER.MAX_ITER", "999"], "--opts: --records reports the cells as their "
                                                                  "records hold them"),
                           (["--configs", "gw=configs/Study/gw.yaml", "--seeds", "0"], "--configs, --seeds: "),
                           # accepted, and the report byte for byte the default one
                           (["--no-example-weighing", "--dataset", "coco"], "--dataset, --no-example-weighing: "
                                                                            "--records reports the cells as"),
                           (["--study", "heads"], "--study heads --records " + str(records) + ": gw-b2-s3 are not "
                                                  "cells of that study")):
        with pytest.raises(SystemExit) as exit_:
            main([*flags, "--records", str(records), "--report-to", str(tmp_path / "report")])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
        assert not (tmp_path / "report").exists()
    # a custom study's cell (no -b<images> in its name) is no cell of the paper's study
    record = RunFolder(records / "gw-b2-s3").read_json("study_cell.json")
    record["cell"]["name"] = "gw-s3"
    RunFolder(records / "gw-b2-s3").write_json("study_cell.json", record)
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(records), "--report-to", str(tmp_path / "report")])
    assert "gw-s3 are not cells of that study" in capsys.readouterr().err
    assert main(["--records", str(records), "--report-to", str(tmp_path / "report")]) == 0  # a custom report


def test_two_records_of_one_cell_are_refused(tmp_path):
    # the later folder in sort order won: a backup copy's edited results were reported
    records = _record_copy(tmp_path)
    shutil.copytree(records / "gw-b2-s3", records / "gw-b2-s3-backup")
    with pytest.raises(ValueError, match=r"two records of the cell gw-b2-s3, gw-b2-s3/ and gw-b2-s3-backup/ \(a copy "
                                         r"kept beside the record\?\)"):
        recorded_cells(records)
    # a version --on-mismatch new-folder made was called "a copy kept beside the record?"
    shutil.move(str(records / "gw-b2-s3-backup"), str(records / "gw-b2-s3.2"))
    with pytest.raises(ValueError, match=r"\(gw-b2-s3.2 holds the cell trained with another config, as --on-mismatch "
                                         r"new-folder names it\)"):
        recorded_cells(records)


@pytest.mark.parametrize("change, problem", [
    (lambda r: r["cell"].update(schedule_scale=2), "cell with 'schedule_scale', which this version does not know"),
    (lambda r: r["cell"].pop("group"), "cell without 'group'"),
    (lambda r: r.pop("config"), "no 'config'"),
])
def test_a_record_of_another_gwdet_version_is_refused_by_name(tmp_path, change, problem):
    # raw TypeError / KeyError tracebacks
    records = _record_copy(tmp_path)
    folder = RunFolder(records / "gw-b2-s3")
    record = folder.read_json("study_cell.json")
    change(record)
    folder.write_json("study_cell.json", record)
    with pytest.raises(ValueError, match="study_cell.json is not a cell record of this version of gwdet") as error:
        recorded_cells(records)
    assert problem in str(error.value)


def test_a_cell_trained_further_outside_the_study_is_not_reported(tmp_path, capsys):
    # a finished cell continued by hand (--resume SOLVER.MAX_ITER 40) was reported as the cell
    records = _record_copy(tmp_path)
    config = records / "gw-b2-s3" / "config.yaml"
    text = config.read_text()
    assert "  MAX_ITER: 4000\n" in text
    write_text_with_checksum(str(config), text.replace("  MAX_ITER: 4000\n", "  MAX_ITER: 5000\n"))
    with pytest.raises(SystemExit) as exit_:
        main(["--records", str(records), "--report-to", str(tmp_path / "report")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "config.yaml) is not the cell's recorded config" in err
    assert "SOLVER.MAX_ITER: recorded 4000, config.yaml 5000" in err
    assert not (tmp_path / "report").exists()


def test_the_report_names_cells_run_by_other_code_than_planned(tmp_path):
    # a cell resumed with newer code kept claiming the commit it was planned with
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    planned = recorded_cells(records)
    assert code_note(planned) is None  # the committed records: no code recorded per run
    planned_with = code_label(read_record(planned[1].folder)["code"])
    usage = planned[1].folder.read_json("study_run.json")
    write_usage(planned[1].folder, dict(usage, code=[planned_with]), 1.0, 1.0)
    assert code_note(planned) == (f"Cells run by another version of the code than planned, or by several: gw-b2-s3 "
                                  f"(planned with {planned_with}; run with {planned_with}, {running_code_label()}).")
    after = planned[1].folder.read_json("study_run.json")
    assert after["wall_seconds"] == usage["wall_seconds"] + 1.0 and after["sessions"] == usage["sessions"] + 1


def test_the_over_training_tool_and_export_name_their_flags_in_one_line(tmp_path, capsys):
    # raw tracebacks; a missing --runs folder named as --records; --export-records onto a file
    # failed after the report was written
    from gwdet_lab.study.over_training import main as over_training

    records = _record_copy(tmp_path)
    for argv, message in (
            (["--runs", str(tmp_path / "none")], f"--runs {tmp_path / 'none'}: no such folder (a study's run folders "),
            (["--records", str(records)], f"--records {records}: no over_training.json for gw-b2-s3: those cells were "
                                          "not measured; measure them from their run folders with --runs"),
            (["--records", str(records), "--cells", "gw-b2-s9"], "--cells: no record of gw-b2-s9"),
            # --subset -3 measured all but 3 images, labelled "the first -3"; 0 ended in a raw ValueError
            (["--runs", str(records), "--subset", "-3"], "--subset (training images) must be >= 1, got -3"),
            (["--runs", str(records), "--cells", "gw-b2-s3", "--cells", "gn-b2-s3"], "--cells is given more than once")):
        cells = [] if "--cells" in argv else ["--cells", "gw-b2-s3"]
        with pytest.raises(SystemExit) as exit_:
            over_training([*argv, *cells, "--out", str(tmp_path / "out")])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "table.md").write_text("my own notes")  # was replaced by the report without a word
    recorded = json.loads((RECORDS / "paper" / "gw-b2-s0" / "over_training.json").read_text())
    (records / "gw-b2-s3" / "over_training.json").write_text(json.dumps(recorded))
    with pytest.raises(SystemExit):
        over_training(["--records", str(records), "--cells", "gw-b2-s3", "--out", str(notes)])
    assert f"--out {notes} holds table.md, which the report would replace" in capsys.readouterr().err
    assert (notes / "table.md").read_text() == "my own notes"
    (tmp_path / "afile.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--report-to", str(tmp_path / "report"), "--export-records",
              str(tmp_path / "afile.txt")])
    assert "--export-records" in capsys.readouterr().err and not (tmp_path / "report").exists()


def test_records_without_their_checksums_or_with_another_cells_detections_are_refused(tmp_path, capsys, monkeypatch):
    # a results.json whose .sha256 was deleted was read unchecked; detections copied over from
    # another cell were resampled as this cell's (its bootstrap cache recomputed from them)
    monkeypatch.setenv("GWDET_CACHE", str(tmp_path / "cache"))  # the test split's annotations need no dataset there
    records = _record_copy(tmp_path, cells=("gw-b2-s3", "gn-b2-s3"))
    edited = records / "gw-b2-s3" / "results.json"
    edited.write_text(edited.read_text().replace('"AP": ', '"AP": 1', 1))
    (records / "gw-b2-s3" / "results.json.sha256").unlink()
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--report-to", str(tmp_path / "report")])
    assert (f"{edited} is damaged (its SHA-256 record results.json.sha256, which exported records keep beside it, "
            "is missing). Records are only read") in capsys.readouterr().err
    shutil.rmtree(records / "gw-b2-s3")
    records = _record_copy(tmp_path)
    metrics = records / "gw-b2-s3" / "metrics.json"  # cut in half: a wrong final loss and a half curve, reported
    whole = metrics.read_bytes()
    metrics.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--report-to", str(tmp_path / "report")])
    assert f"{metrics} is damaged (its SHA-256 differs from the one recorded" in capsys.readouterr().err
    metrics.write_bytes(whole)
    detections = Path("inference", "shapes_test", "coco_instances_results.json.gz")
    shutil.copy(RECORDS / "paper-seeds-3-4" / "gn-b2-s3" / detections, records / "gw-b2-s3" / detections)
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--report-to", str(tmp_path / "report")])
    assert ("coco_instances_results.json.gz gives a box AP of 55.7183 on shapes_test's images, but the cell's "
            "results.json records 56.0826: these are not the detections its results were computed from") \
        in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
    assert not (tmp_path / "cache").exists(), "the study's 6000 images were generated to resample 500"


def test_records_without_their_detections_name_the_way_on(tmp_path, capsys):
    # "no detections to resample; evaluate the cell on shapes_test first": records are never evaluated
    records = _record_copy(tmp_path)
    shutil.rmtree(records / "gw-b2-s3" / "inference")
    (records / "gw-b2-s3" / "image_bootstrap.json").unlink()
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--report-to", str(tmp_path / "report")])
    assert ("no detections to resample, which the resampled APs are checked against. Restore the file (a cell's "
            "exported records keep it as coco_instances_results.json.gz)") in capsys.readouterr().err


def test_the_report_names_values_other_than_the_norms_in_which_compared_cells_differ():
    # GW cells of 2 iterations were compared with GN cells of 3 as if they differed in their norms only
    import dataclasses

    gn, gw = recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3", "gn-b2-s3"])
    assert confounded_note([gn, gw]) is None  # the study's configs differ in norm keys only
    longer = gn.cfg.clone()
    longer.SOLVER.MAX_ITER = gn.cfg.SOLVER.MAX_ITER + 1000
    note = confounded_note([dataclasses.replace(gn, cfg=longer), gw])
    assert note == (f"Cells compared at the same batch size and seed differ in more than their norms: SOLVER.MAX_ITER "
                    f"(gn-b2-s3 {longer.SOLVER.MAX_ITER}, gw-b2-s3 {gw.cfg.SOLVER.MAX_ITER}). Their differences mix "
                    "those values with the norms'.")
    other_seed = dataclasses.replace(gn, cell=dataclasses.replace(gn.cell, seed=4), cfg=longer)
    assert confounded_note([other_seed, gw]) is None  # not compared with each other


def test_an_export_over_records_of_the_cell_with_another_config_is_refused(tmp_path):
    # the records of another study's cells of the same names (another schedule) were replaced without a word
    destination = _record_copy(tmp_path)
    folder = RunFolder(destination / "gw-b2-s3")
    record = folder.read_json("study_cell.json")
    record["config"] = record["config"].replace("  MAX_ITER: 4000\n", "  MAX_ITER: 2\n")
    folder.write_json("study_cell.json", record)
    before = {path.name: path.read_bytes() for path in folder.path.iterdir() if path.is_file()}
    with pytest.raises(ValueError) as refused:
        export_records(recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3"]), destination)
    assert str(refused.value) == (
        f"--export-records {destination} holds records of gw-b2-s3 (SOLVER.MAX_ITER: recorded 2, exported 4000) "
        "trained with another config than the exported cells; exporting would replace them; nothing was copied. "
        "Export into another folder, or move those records away first.")
    assert {path.name: path.read_bytes() for path in folder.path.iterdir() if path.is_file()} == before


def test_holm_adjustment_by_hand():
    # sorted: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06, kept monotone), 0.5 (x1)
    adjusted = holm_adjusted([0.03, 0.5, 0.01, None, 0.02])
    assert adjusted[3] is None
    assert adjusted[:3] + adjusted[4:] == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert holm_adjusted([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # 2 x 0.8 capped at 1; then never below it


def test_holm_turns_a_marginal_ordering_into_cannot_resolve():
    values = {"a": {0: 2.0, 1: 3.0, 2: 4.0}, "b": {0: 0.0, 1: 0.0, 2: 0.0},
              "c": {0: 1.0, 1: -1.0, 2: 0.5}, "d": {0: 0.0, 1: 0.0, 2: 0.0}}
    marginal, unresolved = paired_difference("a", "b", values), paired_difference("c", "d", values)
    assert marginal.verdict == "supports" and 0.025 < marginal.p_value < 0.05
    adjusted = with_holm([marginal, unresolved])
    # the smaller p of two is doubled; the larger one is kept, and never falls below the first
    assert adjusted[0].holm_p == pytest.approx(2 * marginal.p_value)
    assert adjusted[1].holm_p == pytest.approx(max(2 * marginal.p_value, unresolved.p_value))
    assert adjusted[0].holm_verdict == "cannot resolve" and adjusted[1].holm_verdict == "cannot resolve"
    assert with_holm([marginal])[0].holm_verdict == "supports"  # a family of one: unchanged
    assert marginal.holm_verdict is None  # not adjusted: no Holm verdict


def test_the_interval_with_test_image_noise_adds_the_shared_variance():
    values = {"a": {0: 1.0, 1: 2.0, 2: 0.0}, "b": {0: 0.0, 1: 0.0, 2: 0.0}}
    # resamples: a's AP moves by +-0.5 on every seed alike (shared test images), b's not at all
    resampled = {"a": {s: [values["a"][s] + e for e in (-0.5, 0.5, -0.5, 0.5)] for s in range(3)},
                 "b": {s: [0.0] * 4 for s in range(3)}}
    d = paired_difference("a", "b", values, resampled=resampled)
    image_var = 1 / 3  # variance (n - 1) of -0.5, 0.5, -0.5, 0.5 around mean 1.0
    assert d.image_var == pytest.approx(image_var)
    half = t_quantile(0.95, 2) * math.sqrt(1.0 / 3 + image_var)  # sd of differences 1.0
    assert d.with_image_noise == pytest.approx((1.0 - half, 1.0 + half))
    assert d.with_image_noise[0] < d.low and d.with_image_noise[1] > d.high


def test_equivalence_by_two_one_sided_tests():
    close = {"a": {s: 50.0 + 0.1 * (s % 2) for s in range(20)}, "b": {s: 50.0 for s in range(20)}}
    assert paired_difference("a", "b", close).equivalent(margin=1.0) is True
    far = {"a": {s: 51.5 + 0.1 * (s % 2) for s in range(20)}, "b": {s: 50.0 for s in range(20)}}
    assert paired_difference("a", "b", far).equivalent(margin=1.0) is False
    # the 90% interval decides: a mean of 0.5 with an interval reaching past 1 is not equivalent
    wide = {"a": {0: 0.0, 1: 1.0, 2: 0.5}, "b": {0: 0.0, 1: 0.0, 2: 0.0}}
    d = paired_difference("a", "b", wide)
    low, high = d.interval(0.90)
    assert high > 1.0 and d.equivalent(margin=1.0) is False
    assert paired_difference("a", "b", {"a": {0: 1.0}, "b": {0: 0.0}}).equivalent() is None


def test_kept_checkpoints_in_training_order_with_the_final_weights_last(tmp_path):
    from gwdet_lab.study.over_training import kept_checkpoints
    from gwdet_lab.study.run_folder import RunFolder

    for name in ("model_0000999.pth", "model_0000499.pth", "model_final.pth", "model_best_by_me.pth", "log.txt"):
        (tmp_path / name).write_bytes(b"")
    found = kept_checkpoints(RunFolder(tmp_path), max_iter=1500)
    assert [(iteration, path.name) for iteration, path in found] == [
        (500, "model_0000499.pth"), (1000, "model_0000999.pth"), (1500, "model_final.pth")]


def test_over_training_report_from_records(tmp_path, capsys):
    from gwdet.utils.atomic import write_text_with_checksum
    from gwdet_lab.study.over_training import main as over_training

    for cell, curve, subset in (("gn-b2-s3", {"500": 10.0, "4000": 55.7}, {"running": 70.0}),
                                ("gw-b2-s3", {"500": 8.0, "4000": 56.1}, {"running": 71.0})):
        shutil.copytree(RECORDS / "paper-seeds-3-4" / cell, tmp_path / "records" / cell)
        write_text_with_checksum(str(tmp_path / "records" / cell / "over_training.json"), json.dumps(
            {"key": {"checkpoints": [500, 4000], "subset": 200, "batch_size": 2},
             "val_box_ap": curve, "train_subset_box_ap": subset}))  # as exported records keep it: with its SHA-256
    assert over_training(["--records", str(tmp_path / "records"), "--cells", "gw-b2-s3", "gn-b2-s3",
                          "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "table.md").read_text()
    assert "| gn-b2-s3 | 10.00 | 55.70 |" in table and "| gw-b2-s3 | 8.00 | 56.10 |" in table
    assert "| gw-b2-s3 | GW | 56.10 | 71.00 | – | – |" in table and "shapes_train_first200" in table
    assert (tmp_path / "report" / "ap_over_training.png").stat().st_size > 1000
    # a report of one of them into that folder replaced the two-cell report and its figure without a word
    written = {name: (tmp_path / "report" / name).read_bytes() for name in ("table.md", "ap_over_training.png")}
    with pytest.raises(SystemExit):
        over_training(["--records", str(tmp_path / "records"), "--cells", "gw-b2-s3", "--out", str(tmp_path / "report")])
    assert (f"--out {tmp_path / 'report'} holds the report of other cells (gn-b2-s3), which this report would "
            "replace; nothing was written") in capsys.readouterr().err
    assert {name: (tmp_path / "report" / name).read_bytes() for name in written} == written
    # --subset with --records: the records' 200-image subset reported without a word
    with pytest.raises(SystemExit):
        over_training(["--records", str(tmp_path / "records"), "--cells", "gw-b2-s3", "--subset", "50",
                       "--out", str(tmp_path / "o1")])
    assert "--subset 50: --records reports what the records hold" in capsys.readouterr().err
    # measured while the cell trained (its last checkpoint then 3500): reported as its final weights before
    partial = tmp_path / "records" / "gw-b2-s3" / "over_training.json"
    write_text_with_checksum(str(partial), json.dumps({"key": {"checkpoints": [500, 3500], "subset": 200, "batch_size": 2},
                                                      "val_box_ap": {"500": 8.0, "3500": 50.0},
                                                      "train_subset_box_ap": {}}))
    with pytest.raises(SystemExit):
        over_training(["--records", str(tmp_path / "records"), "--cells", "gw-b2-s3", "--out", str(tmp_path / "o2")])
    assert "gw-b2-s3 (to iteration 3500 of 4000) was measured before the cell's training ended" in \
        capsys.readouterr().err
    # and --runs refuses cells that have not finished training (no model_final.pth in a records folder)
    with pytest.raises(SystemExit):
        over_training(["--runs", str(tmp_path / "records"), "--cells", "gw-b2-s3", "--out", str(tmp_path / "o3")])
    assert "gw-b2-s3 have not finished training (no model_final.pth" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_exporting_records_keeps_the_users_files_and_never_exports_a_folder_onto_itself(tmp_path):
    # --export-records into the folder the records are read from emptied every cell record (85 MB of runs
    # too, given <out>/runs); into a records folder it deleted the user's NOTES.md beside a record
    from gwdet.errors import GwdetValueError

    source = recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3"])
    copy = tmp_path / "copy"
    export_records(source, copy)
    (copy / "gw-b2-s3" / "NOTES.md").write_text("mine")
    again = recorded_cells(copy, ["gw-b2-s3"])
    before = {p.name: p.read_bytes() for p in (copy / "gw-b2-s3").iterdir() if p.is_file()}
    with pytest.raises(GwdetValueError, match=r"the records of gw-b2-s3 are read from there .* nothing was copied"):
        export_records(again, copy)
    assert {p.name: p.read_bytes() for p in (copy / "gw-b2-s3").iterdir() if p.is_file()} == before
    export_records(source, copy)  # an update of the record: the user's file stays
    assert (copy / "gw-b2-s3" / "NOTES.md").read_text() == "mine"
    assert (copy / "gw-b2-s3" / "study_cell.json").is_file()


def test_a_cell_that_detected_nothing_is_left_out_of_the_means_not_a_crash():
    # statistics.stdev of a NaN AP stopped the report with a raw AttributeError, after every cell had trained
    import statistics

    from gwdet_lab.study.stats import mean, std

    assert std([1.0, math.nan, 3.0]) == statistics.stdev([1.0, 3.0]) and mean([1.0, math.nan, 3.0]) == 2.0
    assert math.isnan(mean([math.nan])) and std([math.nan, 2.0]) is None and mean([]) is None


def test_a_record_of_an_ap_that_is_nan_is_strict_json_and_read_back_as_nan(tmp_path):
    # a weight whose model detects nothing has AP NaN: the study's records wrote it as bare NaN, which
    # strict JSON readers (JavaScript, jq) refuse
    folder = RunFolder(tmp_path / "cell")
    folder.write_json("example_weighing.json", {"val": {"0.5": {"bbox": {"AP": math.nan}}}, "chosen": 0.5})
    text = (tmp_path / "cell" / "example_weighing.json").read_text()
    strict = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} written in {text}"))
    assert strict["val"]["0.5"]["bbox"]["AP"] is None
    assert math.isnan(folder.read_json("example_weighing.json", null_is_nan=True)["val"]["0.5"]["bbox"]["AP"])
    assert folder.read_json("example_weighing.json")["chosen"] == 0.5


def test_files_where_the_study_and_the_export_make_folders_are_named(tmp_path, capsys):
    # raw NotADirectoryError (--out holding a file 'runs') and FileExistsError (a file named like a cell)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "runs").write_text("mine")
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--list", "--out", str(tmp_path / "out")])
    assert f"--out {tmp_path / 'out'} holds a file named runs, where the study keeps its cells' run folders" in \
        capsys.readouterr().err
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "gw-b2-s3").write_text("mine")
    with pytest.raises(ValueError, match=r"holds a file named like the cell gw-b2-s3, where its records go into a "
                                         r"folder of that name; nothing was copied"):
        export_records(recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3"]), tmp_path / "dest")
    assert (tmp_path / "dest" / "gw-b2-s3").read_text() == "mine"


def test_an_export_that_cannot_write_names_the_cell_and_the_file(tmp_path):
    # a full disk gave a raw OSError traceback and left a 0-byte record
    destination = tmp_path / "dest"
    (destination / "gw-b2-s3" / "results.json").mkdir(parents=True)  # a write that fails, as on a full disk
    with pytest.raises(OSError) as refused:
        export_records(recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3"]), destination)
    assert str(refused.value).startswith(f"--export-records {destination}: copying the records of gw-b2-s3 failed (")
    assert str(refused.value).endswith("0 cell(s) were copied before it. Free space (or fix what the error names) "
                                       "and export again.")


def test_a_study_on_a_read_only_disk_is_reported_through_its_records_and_its_curves_refused(tmp_path, capsys):
    # before: "--out ... cannot be written ... Give a folder this process may write", while another
    # --out holds none of the cells; the way that reads them (--records <out>/runs) was not named
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (chmod does not stop root)")
    name = "paper-seeds-3-4"
    archived = tmp_path / "archived"
    shutil.copytree(RECORDS / name, archived / "runs")
    (archived / "runs" / "gw-b2-s3" / "model_final.pth").write_bytes(b"")  # a trained cell, for over_training
    study = tmp_path / "study"
    study.mkdir()
    subprocess.run(["mount", "--bind", str(archived), str(study)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(study)], check=True)
        for flag in ("--report-only", "--list"):
            with pytest.raises(SystemExit):
                main(["--study", "paper", "--out", str(study), flag])
            assert (f"--out {study} cannot be written: this process may not write into it (a read-only disk, or "
                    f"another owner's folder). Give a folder this process may write. To report the cells this study "
                    f"holds without writing into --out, read them as records: --records {study / 'runs'} "
                    "--report-to DIR") in capsys.readouterr().err
        # a report folder on that disk, new or there: a raw OSError (Errno 30), or the full disk's "Make space"
        (archived / "existing").mkdir(exist_ok=True)
        for folder, written in ((study / "new", study), (study / "existing", study / "existing")):
            with pytest.raises(SystemExit):
                main(["--study", "paper", "--records", str(study / "runs"), "--report-to", str(folder)])
            said = capsys.readouterr().err
            assert f"--report-to {folder} cannot be written: " in said and "Make space" not in said, said
            assert str(written) in said
        report = tmp_path / "report"
        assert main(["--study", "paper", "--records", str(study / "runs"), "--report-to", str(report)]) == 0
        assert (report / "table.md").read_text() == (REPO / "docs" / "study" / name / "table.md").read_text()
        # over_training keeps its measurements in the cells' folders: a raw OSError (Errno 30) before
        from gwdet_lab.study.over_training import main as over_training
        with pytest.raises(SystemExit):
            over_training(["--runs", str(study / "runs"), "--cells", "gw-b2-s3", "--out", str(tmp_path / "curves")])
        assert (f"--runs {study / 'runs'}: the run folders of gw-b2-s3 cannot be written (a read-only disk, or "
                "another owner's folders)") in capsys.readouterr().err
    finally:
        subprocess.run(["umount", str(study)], check=True)


def test_a_report_that_fills_the_disk_leaves_no_half_report(tmp_path, capsys, monkeypatch):
    # before: a raw traceback from PIL, and table.md and the CSVs of the new report beside no figures
    import errno
    import os

    from gwdet_lab.study import report as study_report

    def full_disk(results, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(study_report, "plot_loss_curves", full_disk)
    folder = tmp_path / "report"
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(RECORDS / "paper-seeds-3-4"), "--report-to", str(folder)])
    said = capsys.readouterr().err
    assert (f"cannot write the report into {folder}: No space left on device; no file of the new report was put "
            "there, and what was there is kept as it was. Make space (or give another --report-to) and run") in said
    assert list(folder.iterdir()) == []
    # another failure than a full disk is not told to make space
    def denied(results, path):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(study_report, "plot_loss_curves", denied)
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(RECORDS / "paper-seeds-3-4"), "--report-to", str(folder)])
    assert "Permission denied; no file of the new report was put there, and what was there is kept as it was. Give " \
        "a --report-to this process may write and run the same command again" in capsys.readouterr().err


# before: the earlier complete report's files were all deleted when the new one could not be written (a full disk)
def test_a_report_that_fills_the_disk_keeps_the_earlier_complete_report(tmp_path, capsys, monkeypatch):
    import errno
    import os

    from gwdet_lab.study import report as study_report

    folder = tmp_path / "report"
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    assert main(["--records", str(records), "--report-to", str(folder)]) == 0
    earlier = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert len(earlier) == 6
    capsys.readouterr()

    def full_disk(results, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(study_report, "plot_loss_curves", full_disk)
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--report-to", str(folder)])
    assert (f"cannot write the report into {folder}: No space left on device; no file of the new report was put "
            "there, and what was there is kept as it was.") in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == earlier


def _exported_with_other_results(tmp_path):
    """Records of gw-b2-s3 exported into tmp_path/exp, then its results.json there (with its record)
    changed to hold other results of the same config, as another run of the cell would."""
    import hashlib

    records = _record_copy(tmp_path)
    exported = tmp_path / "exp"
    assert main(["--records", str(records), "--report-to", str(tmp_path / "rep"), "--export-records",
                 str(exported)]) == 0
    path = exported / "gw-b2-s3" / "results.json"
    results = json.loads(path.read_text())
    dataset = next(name for name in results if name != "environment")
    value = results[dataset]["bbox"]["AP"]
    results[dataset]["bbox"]["AP"] = value + 0.02
    text = json.dumps(results)
    path.write_text(text)
    (exported / "gw-b2-s3" / "results.json.sha256").write_text(
        hashlib.sha256(text.encode()).hexdigest() + "  results.json\n")
    return records, exported, path, f"gw-b2-s3 ({dataset} bbox AP {value + 0.02:.2f} -> {value:.2f})"


# before: records of the same cell (same config) with other results were replaced without --overwrite and without a word
def test_export_refuses_to_replace_a_cells_other_results_without_overwrite(tmp_path, capsys):
    records, exported, path, named = _exported_with_other_results(tmp_path)
    kept = path.read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--report-to", str(tmp_path / "rep"), "--export-records", str(exported)])
    assert (f"--export-records {exported} holds records of {named} with the same config but other results than the "
            "exported cells (another run of them); exporting would replace them; nothing was copied. Pass --overwrite "
            "to replace them") in capsys.readouterr().err
    assert path.read_bytes() == kept
    assert main(["--records", str(records), "--report-to", str(tmp_path / "rep"), "--export-records", str(exported),
                 "--overwrite"]) == 0
    assert (f"--overwrite: replaced the records of 1 cell(s) in {exported} that held other results: {named}"
            in capsys.readouterr().out)
    assert path.read_bytes() == (records / "gw-b2-s3" / "results.json").read_bytes()
    # the same results again: copied without a word, as before
    assert main(["--records", str(records), "--report-to", str(tmp_path / "rep"), "--export-records", str(exported)]) == 0


def test_records_listed_are_listed_not_reported(tmp_path, capsys, monkeypatch):
    # --records R --list wrote a report into ./output/study/custom/ and listed nothing
    monkeypatch.chdir(tmp_path)
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    assert main(["--records", str(records), "--list"]) == 0
    out = capsys.readouterr().out
    assert "gw-b2-s3" in out and "gn-b2-s3" in out and not (tmp_path / "output").exists()


def test_a_refused_export_after_a_written_report_says_the_report_is_written(tmp_path, capsys):
    # "error: no report written: ..." while the report was there
    destination = _record_copy(tmp_path / "other")
    folder = RunFolder(destination / "gw-b2-s3")
    record = folder.read_json("study_cell.json")
    record["config"] = record["config"].replace("  MAX_ITER: 4000\n", "  MAX_ITER: 2\n")
    folder.write_json("study_cell.json", record)
    report = tmp_path / "report"
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(RECORDS / "paper-seeds-3-4"), "--report-to", str(report),
              "--export-records", str(destination)])
    err = capsys.readouterr().err
    assert "the records were not exported: --export-records" in err and "no report written" not in err
    assert (report / "table.md").is_file()


def test_a_report_over_another_studys_report_is_refused(tmp_path, capsys):
    # two custom studies in one --out both wrote <out>/custom: the second replaced the first's report
    first, second = _record_copy(tmp_path / "a", ("gw-b2-s3",)), _record_copy(tmp_path / "b", ("gn-b2-s3",))
    report = tmp_path / "report"
    assert main(["--records", str(first), "--report-to", str(report)]) == 0
    before = (report / "table.md").read_text()
    with pytest.raises(SystemExit):
        main(["--records", str(second), "--report-to", str(report)])
    assert f"{report} holds the report of other cells (gw-b2-s3): another study's in the same place" in \
        capsys.readouterr().err
    assert (report / "table.md").read_text() == before
    assert main(["--records", str(first), "--report-to", str(report)]) == 0  # the same study's report: replaced


def test_a_records_report_notes_the_overrides_its_cells_shared(tmp_path):
    # the run's report said "Common overrides of every cell: ..."; the report of its records dropped it
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    for cell in ("gw-b2-s3", "gn-b2-s3"):
        record = RunFolder(records / cell).read_json("study_cell.json")
        record["common_opts"] = ["SOLVER.MAX_ITER", "8"]
        RunFolder(records / cell).write_json("study_cell.json", record)
    assert main(["--records", str(records), "--report-to", str(tmp_path / "report")]) == 0
    reported = "\n".join(path.read_text() for path in (tmp_path / "report").glob("*.md"))
    assert "Common overrides of every cell: SOLVER.MAX_ITER 8." in reported


# before: a GW with 2 groups (--extra gw=... MODEL.GW.NUM_GROUPS 2) was reported beside the paper's GW number
# (g=64, T=5, R-50), and GW > GN beside the paper's +0.60
def test_a_configuration_whose_overrides_change_its_model_gets_no_paper_number(tmp_path):
    from gwdet_lab.study.cells import model_overrides

    assert model_overrides(["MODEL.DEVICE", "cuda", "SOLVER.BASE_LR", "0.02", "MODEL.RESNETS.DEPTH", "101", "SEED",
                            "1"]) == ("MODEL.RESNETS.DEPTH 101",)
    records = _record_copy(tmp_path, ("gw-b2-s3", "gn-b2-s3"))
    folder = RunFolder(records / "gw-b2-s3")
    record = folder.read_json("study_cell.json")
    record["cell"]["opts"] = ["MODEL.GW.NUM_GROUPS", "2", *record["cell"]["opts"]]
    record["opts"] = ["MODEL.GW.NUM_GROUPS", "2", *record["opts"]]
    folder.write_json("study_cell.json", record)
    assert main(["--records", str(records), "--report-to", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "table.md").read_text()
    assert "\n| GN | 2 | 1 | 28.19 | 55.72 |" in table and "\n| GW | 2 | 1 | – | 56.08 |" in table
    assert "\n| GW > GN | 2 | – | 1 | +0.36 |" in table
    assert ("- The paper column, and the paper's difference in each comparison with it, is left empty for GW "
            "(overrides MODEL.GW.NUM_GROUPS 2): an override of a MODEL key (other than MODEL.DEVICE) makes another "
            "model than the configuration's config file, so the paper's number is not that model's.") in table


# before: a cell's record folder one level down (rec/sub/gw-b2-s4/) was not read, and the report was written
# from the other cells without a word
def test_cell_records_one_level_down_are_refused_naming_their_folder(tmp_path, capsys):
    records = tmp_path / "records"
    shutil.copytree(RECORDS / "paper-seeds-3-4", records)
    (records / "sub").mkdir()
    shutil.move(str(records / "gw-b2-s4"), str(records / "sub"))
    with pytest.raises(SystemExit) as exit_:
        main(["--study", "paper", "--records", str(records), "--report-to", str(tmp_path / "report")])
    assert exit_.value.code == 2
    assert (f"--records {records}: sub/ (gw-b2-s4) holds cell records one level below the others, where they are not "
            f"read: the report would leave those cells out. Move their folders up into {records} beside the others, "
            "or out of it if they are not of this report; nothing was written.") in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
    # --only of the cells beside them reads those alone; a folder of studies' records names where the cells are
    assert [p.cell.name for p in recorded_cells(records, ["gw-b2-s3", "gn-b2-s3"])] == ["gn-b2-s3", "gw-b2-s3"]
    with pytest.raises(FileNotFoundError, match=r"no cell records in it \(folders with study_cell.json\); its sub-folders "
                                                r"batch-sweep/, .* hold cell records: give one of them, e.g. --records "
                                                r".*records/batch-sweep$"):
        recorded_cells(RECORDS)


def _cut_short(records):
    for name in ("study_cell.json", "study_cell.json.sha256"):
        (records / "gw-b2-s4" / name).unlink()


def _two_levels_down(records):
    (records / "a" / "b").mkdir(parents=True)
    shutil.move(str(records / "gw-b2-s4"), str(records / "a" / "b"))


def _link_to_nothing(records):
    shutil.rmtree(records / "gw-b2-s4")
    (records / "gw-b2-s4").symlink_to("/nonexistent/gw-b2-s4")


def _emptied(records):
    shutil.rmtree(records / "gw-b2-s4")
    (records / "gw-b2-s4").mkdir()


# before: each was left out of the report without a word, which was written from the 3 other cells
@pytest.mark.parametrize("damage, problem, fix", [
    (_cut_short, "gw-b2-s4/ holds a cell's records (image_bootstrap.json, inference/, metrics.json, results.json, ... "
                 "(4 more)) but no study_cell.json, so it is not read (a copy or export cut short?)",
     "Copy the records of gw-b2-s4 again (a finished study exports them with its command and --report-only "
     "--export-records DIR), or move it out of {records} if not of this report"),
    (_two_levels_down, "a/b/ (gw-b2-s4) holds cell records two levels below the others, where they are not read",
     "Move their folders up into {records} beside the others, or out of it if they are not of this report"),
    (_link_to_nothing, "gw-b2-s4 is a link to /nonexistent/gw-b2-s4, which does not exist (a disk that is not "
                       "mounted?)",
     "Mount or restore what gw-b2-s4 points to (or copy the records in its place), or remove the link if not of this "
     "report"),
    (_emptied, "gw-b2-s4/ is named like a cell but is empty (a copy that never started?)",
     "Copy the records of gw-b2-s4 again (a finished study exports them with its command and --report-only "
     "--export-records DIR), or move it out of {records} if not of this report"),
], ids=["no-study_cell.json", "two-levels-down", "link-to-nothing", "empty-folder"])
def test_a_cell_of_the_records_that_is_not_read_is_refused_naming_it(tmp_path, capsys, damage, problem, fix):
    records = tmp_path / "records"
    shutil.copytree(RECORDS / "paper-seeds-3-4", records)
    damage(records)
    with pytest.raises(SystemExit) as exit_:
        main(["--study", "paper", "--records", str(records), "--report-to", str(tmp_path / "report")])
    assert exit_.value.code == 2
    assert (f"--records {records}: {problem}: the report would leave those cells out. {fix.format(records=records)}; "
            "nothing was written.") in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
    # --only of the cells beside it reads those alone
    assert [p.cell.name for p in recorded_cells(records, ["gw-b2-s3", "gn-b2-s3"])] == ["gn-b2-s3", "gw-b2-s3"]


# before: a link to cell records below the others was refused as records not read, though the link reads them
def test_links_to_records_read_already_and_link_loops_leave_no_cell_out(tmp_path):
    records = tmp_path / "records"
    shutil.copytree(RECORDS / "paper-seeds-3-4", records)
    (records / "sub").mkdir()
    shutil.move(str(records / "gw-b2-s4"), str(records / "sub"))
    (records / "gw-b2-s4").symlink_to("sub/gw-b2-s4")
    (records / "sub" / "up").symlink_to("..")
    (records / "sub" / "root").symlink_to("/")
    (records / "gw-b2-s3" / "up").symlink_to("..")
    assert [p.cell.name for p in recorded_cells(records)] == ["gn-b2-s3", "gw-b2-s3", "gn-b2-s4", "gw-b2-s4"]


def test_the_per_seed_column_names_the_seeds_a_configuration_has(tmp_path):
    # the column was headed "per seed (s0, s1, ...)" whatever the seeds: with s1 missing, s0 and s2 read as s0 and s1
    assert main(["--study", "paper", "--records", str(RECORDS / "paper"), "--only", "bn-b2-s0", "bn-b2-s2",
                 "--report-to", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "table.md").read_text()
    assert "(s0, s1, ...)" not in table
    row = next(line for line in table.splitlines() if line.startswith("| BN | 2 | 2 |"))
    assert "| s0: 24.49, s2: 25.41 |" in row


def test_an_export_over_a_users_folder_with_a_records_file_name_is_refused(tmp_path):
    # --export-records replaced the user's own <dir>/<cell>/results.md (a folder without study_cell.json) without a word
    from gwdet.errors import GwdetValueError

    source = recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3"])
    mine = tmp_path / "exp" / "gw-b2-s3"
    mine.mkdir(parents=True)
    (mine / "results.md").write_text("mine")
    (mine / "notes.txt").write_text("notes")
    with pytest.raises(GwdetValueError, match=(
            rf"--export-records {tmp_path / 'exp'}: a cell's folder there holds files named as the records an export "
            rf"copies, but no study_cell.json, so no export wrote them: {mine} \(results.md\); exporting would replace "
            r"them; nothing was copied. Move those files away, or export into another folder.")):
        export_records(source, tmp_path / "exp")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "results.md"]
    assert (mine / "results.md").read_text() == "mine"
    (mine / "results.md").unlink()
    export_records(source, tmp_path / "exp")  # the user's other files are kept beside the records
    assert (mine / "notes.txt").read_text() == "notes" and (mine / "study_cell.json").is_file()


# before: a config given relative to another folder was recorded as `--config mybn.yaml`, a command that ran from nowhere
def test_the_recorded_command_names_its_config_as_it_resolves_from_the_repository_root(tmp_path, monkeypatch):
    from detectron2.config import CfgNode

    from gwdet_lab.study.cells import Cell
    from gwdet_lab.study.record import PlannedCell
    from gwdet_lab.study.summary import command_config_path, train_command

    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mybn.yaml"
    cfg = CfgNode({"DATASETS": CfgNode({"TRAIN": ("shapes_train",), "TEST": ("shapes_val",)})})
    opts = ("SEED", "0", "OUTPUT_DIR", "output/study/bn-s0")
    planned = PlannedCell(Cell("bn-s0", "bn", str(mine), opts, 0, 2), opts, cfg, None)  # type: ignore[arg-type]
    assert train_command(planned) == (f"python tools/train_net.py --config {mine} SEED 0 OUTPUT_DIR "
                                      "output/rerun/bn-s0")
    inside = REPO / "configs" / "Study" / "bn.yaml"
    assert command_config_path(str(inside)) == "configs/Study/bn.yaml"
    assert command_config_path("configs/Study/bn.yaml") == "configs/Study/bn.yaml"  # read back from records


# before: records of a --no-example-weighing study were refused as "not finished", with no flag that reported them
def test_records_of_a_study_without_example_weighing_report_with_the_weights_they_swept(tmp_path, capsys):
    records = tmp_path / "records"
    shutil.copytree(RECORDS / "paper" / "bn-b2-s0", records / "bn-b2-s0")
    cell = records / "bn-b2-s0"
    for name in ("example_weighing.json", "example_weighing.json.sha256"):
        (cell / name).unlink()
    write_text_with_checksum(cell / "study_complete.json",
                             json.dumps({"evaluations": ["batch_statistics"], "example_weights": []}, indent=2) + "\n")
    assert main(["--records", str(records), "--report-to", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "table.md").is_file()
    with pytest.raises(SystemExit):
        main(["--records", str(records), "--example-weights", "0", "--report-to", str(tmp_path / "other")])
    assert ("bn-b2-s0 not finished in the records (their example weighing did not sweep --example-weights 0); they "
            "swept none (a study run with --no-example-weighing): leave --example-weights out to report them without "
            "example weighing; nothing was written.") in capsys.readouterr().err


# --launcher slurm, --jobs 4, --threads 2 and --on-mismatch new-folder were taken with --records and ignored without
# a word: the report was written here, the same as without them
@pytest.mark.parametrize("flags, named", [(["--launcher", "slurm"], "--launcher slurm"), (["--jobs", "4"], "--jobs 4"),
                                          (["--threads", "2"], "--threads 2"),
                                          (["--on-mismatch", "new-folder"], "--on-mismatch new-folder"),
                                          (["--num-gpus", "2", "--partition", "gpu", "--wait"],
                                           "--num-gpus 2, --partition gpu, --wait")])
def test_records_with_flags_of_where_and_how_cells_train_are_refused(tmp_path, capsys, flags, named):
    records = _record_copy(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["--records", str(records), "--report-to", str(tmp_path / "report"), *flags])
    assert exit_.value.code == 2
    assert (f"{named}: --records reports the cells as their records hold them (configs, overrides, seeds, batch "
            "sizes, datasets, the evaluations they ran) and trains nothing, here or on a cluster, so these would not "
            "apply; drop them") in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


# records with CRLF line endings (a git checkout with core.autocrlf=true) were called damaged, to be copied again,
# which gives the same bytes
def test_records_with_crlf_line_endings_are_named_so_and_the_repository_keeps_them_unconverted(tmp_path, capsys):
    records = _record_copy(tmp_path)
    cell = records / "gw-b2-s3" / "study_cell.json"
    cell.write_bytes(cell.read_bytes().replace(b"\n", b"\r\n"))
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(records), "--report-to", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert (f"{cell} has CRLF (Windows) line endings where it was written with LF ones: with its lines ending in LF "
            "it matches the SHA-256 recorded in study_cell.json.sha256") in err
    assert "git config core.autocrlf false" in err and "is damaged" not in err
    assert not (tmp_path / "report").exists()
    cell.write_bytes(cell.read_bytes().replace(b"\r\n", b"\n").replace(b'"', b"'", 1))  # other damage: as before
    with pytest.raises(SystemExit):
        main(["--study", "paper", "--records", str(records), "--report-to", str(tmp_path / "report")])
    assert f"{cell} is damaged" in capsys.readouterr().err
    assert "docs/study/records/** -text" in (REPO / ".gitattributes").read_text().splitlines()


# compare_norms.py --records <an empty folder> said "no cell records in it" without the way on
def test_an_empty_records_folder_is_refused_with_where_records_are_kept(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as stopped:
        main(["--records", str(tmp_path / "empty"), "--report-to", str(tmp_path / "report")])
    assert stopped.value.code == 2
    assert (f"--records {tmp_path / 'empty'}: no cell records in it (folders with study_cell.json): give the folder "
            "of a study's records (kept in docs/study/records/<study>/), or one that --export-records wrote") in \
        capsys.readouterr().err


# before: a damaged record in the export destination said "Remove it and run the same command again: the cell
# resumes from its last checkpoint", though no cell trains there, and removing the file alone got the export refused
def test_a_damaged_record_in_the_export_destination_names_the_exports_own_fix(tmp_path):
    from gwdet_lab.study.run_folder import DamagedFile

    source = recorded_cells(RECORDS / "paper-seeds-3-4", ["gw-b2-s3"])
    export_records(source, tmp_path / "exp")
    cell = tmp_path / "exp" / "gw-b2-s3"
    record = cell / "study_cell.json"
    record.write_text(record.read_text().replace('"seed": 3', '"seed": 3 '))
    with pytest.raises(DamagedFile) as refused:
        export_records(source, tmp_path / "exp")
    message = str(refused.value)
    assert message.startswith(f"{record} is damaged (its SHA-256 differs")
    assert message.endswith(
        f"{cell} holds a cell's exported records (its metrics.json has the SHA-256 that an export records, and there "
        "is no checkpoint), where nothing trains: move that folder away (or remove it) and run the export "
        "(--export-records) again, which writes the cell's records anew from those it copies; or export into another "
        "folder.")
    assert "resumes from its last checkpoint" not in message
    shutil.move(cell, tmp_path / "damaged")  # the fix the message gives
    export_records(source, tmp_path / "exp")
    assert read_record(RunFolder(cell))["cell"] == read_record(source[0].folder)["cell"]
    run = RunFolder(tmp_path / "run")  # a training run's folder keeps the training advice
    run.write_json("study_timing.json", {"train": 1.0})
    (run.path / "study_timing.json").write_text("{")
    with pytest.raises(DamagedFile, match="the cell resumes from its last checkpoint and writes it anew"):
        run.read_json("study_timing.json")


# --records (and --runs) given an existing file was refused as "no such folder", though the path exists
def test_records_given_a_file_is_refused_as_a_file_not_a_folder(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("hi\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--dataset", "shapes", "--study", "paper", "--list", "--records", str(afile)])
    assert exit_.value.code == 2
    assert (f"--records {afile} is a file, not a folder: give the folder of a study's records (a study's records are "
            "kept in docs/study/records/<study>/).") in capsys.readouterr().err
    with pytest.raises(OSError, match=r"^--runs .*afile is a file, not a folder: give a study's folder of run folders "
                                      r"\(a study's run folders are in <its --out>/runs/\)\.$"):
        recorded_cells(afile, flag="--runs")
