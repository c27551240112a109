"""largedet_study.reevaluate (batch_scaling_study.py --eval-images): which cells are
evaluated again, with which command, what the CSV gets, and resumption."""

import csv
import json
import os
import sys

import pytest

from largedet_study import reevaluate, runner

# a stand-in for tools/train_net.py --eval-only: records its arguments, writes the results
# (OUTPUT_DIR/eval_results.json) with an AP that depends on the weights' folder, or fails
# for a cell named "broken"; what it prints is not read
FAKE_TRAIN_NET = """
import json, math, os, sys
args = sys.argv[1:]
weights = args[args.index("MODEL.WEIGHTS") + 1]
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps(args) + "\\n")
cell = os.path.basename(os.path.dirname(weights))
if cell == "broken":
    sys.exit("boom")
ap = {"a": 61.25, "b": math.nan, "ema": 62.5}[cell]
print("copypaste: AP,AP50,AP75,APs,APm,APl\\ncopypaste: 1.0,2.0,3.0,4,nan,nan")  # not read
results = {
    "shapes_holdout_val": {"bbox": {"AP": ap, "AP50": 90.5, "AP75": 70.125, "APs": 1.0}},
    "shapes_val": {"bbox": {"AP": 55.555, "AP50": 80, "AP75": 60, "APs": 1.0}},
}
if cell == "ema":  # evaluated on both: the trained weights' results under model/
    results["model/shapes_holdout_val"] = {"bbox": {"AP": 60.004, "AP50": 1, "AP75": 1}}
    results["model/shapes_val"] = {"bbox": {"AP": 54.996, "AP50": 1, "AP75": 1}}
out = args[args.index("OUTPUT_DIR") + 1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "eval_results.json"), "w") as f:
    json.dump(results, f)
"""


def make_cell(root, name, final=True):
    os.makedirs(root / name)
    (root / name / "config.yaml").write_text("")
    if final:
        (root / name / "model_final.pth").write_text("")


def test_finished_cells_are_evaluated_once_on_the_larger_split(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_train_net.py"
    script.write_text(FAKE_TRAIN_NET)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CALLS", str(calls))
    out = tmp_path / "study"
    for name in ("a", "b", "diverged", "unfinished"):
        make_cell(out, name, final=name != "unfinished")
    rows = {name: {"diverged": "yes" if name == "diverged" else "no"} for name in ("a", "b", "diverged", "unfinished")}
    csv_path = str(tmp_path / "holdout.csv")
    cells = ["a", "b", "diverged", "unfinished", "not-run"]
    evaluated = reevaluate.reevaluate_cells(cells, rows, str(out), 2000, csv_path, [sys.executable, str(script)], device_label="vm")
    assert evaluated == ["a", "b"]
    assert "unfinished: no model_final.pth" in capsys.readouterr().out
    with open(csv_path, newline="") as f:
        written = list(csv.DictReader(f))
    assert [(r["cell"], r["images"], r["holdout_ap"], r["holdout_ap50"], r["holdout_ap75"], r["box_ap"],
             r["ap50"], r["ap75"], r["device"]) for r in written] == [
        ("a", "2000", "61.25", "90.50", "70.12", "55.55", "80.00", "60.00", "vm"),  # the last two evaluations
        ("b", "2000", "0.00", "90.50", "70.12", "55.55", "80.00", "60.00", "vm"),  # nothing detected: AP 0
    ]  # fmt: skip
    args = json.loads(calls.read_text().splitlines()[0])
    run_dir = str(out / "a")
    assert args == [
        "--config", os.path.join(run_dir, "config.yaml"), "--eval-only",
        "MODEL.WEIGHTS", os.path.join(run_dir, "model_final.pth"), "DATASETS.SHAPES.NUM_VAL", "2000",
        "DATASETS.TEST", "('shapes_holdout_val', 'shapes_val', )", "OUTPUT_DIR", os.path.join(run_dir, "eval_2000"),
    ]  # fmt: skip
    # again: nothing left to do, the CSV unchanged
    assert reevaluate.reevaluate_cells(cells, rows, str(out), 2000, csv_path, [sys.executable, str(script)]) == []
    assert len(calls.read_text().splitlines()) == 2
    # a failed evaluation names the cell and keeps the rows written before it
    make_cell(out, "broken")
    with pytest.raises(RuntimeError, match=r"broken: evaluation failed \(exit 1; no results for shapes_holdout_val, shapes_val in .*eval_results.json\):\n.*boom"):
        reevaluate.reevaluate_cells(["broken"], {"broken": {"diverged": "no"}}, str(out), 2000, csv_path, [sys.executable, str(script)])
    assert len(open(csv_path).read().splitlines()) == 3
    # another image count goes to another CSV: mixed counts would not be comparable
    with pytest.raises(ValueError, match=r"holds evaluations on \[2000\] images, not 500"):
        reevaluate.reevaluate_cells(cells, rows, str(out), 500, csv_path, [sys.executable, str(script)])
    # an empty file (created beforehand) still gets its header
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    reevaluate.reevaluate_cells(["a"], rows, str(out), 2000, str(empty), [sys.executable, str(script)])
    assert empty.read_text().splitlines()[0].startswith("cell,images,holdout_ap,")


def test_a_dry_run_lists_what_it_would_evaluate_and_evaluates_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    make_cell(out, "sgd-bs16-wu2")
    study_csv = tmp_path / "study.csv"
    study_csv.write_text("cell,diverged\nsgd-bs16-wu2,no\nsgd-bs1024,yes\n")
    eval_csv = tmp_path / "eval.csv"
    runner.main(["--grid", "steps", "--output-dir", str(out), "--csv", str(study_csv),
                 "--eval-images", "2000", "--eval-csv", str(eval_csv), "--dry-run"])  # fmt: skip
    assert "would evaluate on 2000 images: sgd-bs16-wu2" in capsys.readouterr().out
    assert not eval_csv.exists()


def test_the_command_line_checks_the_image_count(capsys):
    with pytest.raises(SystemExit):
        runner.main(["--grid", "steps", "--eval-images", "0"])
    assert "--eval-images must be at least 1, got 0" in capsys.readouterr().err


def test_eval_results_reading():
    assert reevaluate.eval_ap(None) is None
    bbox = {"AP": 75.9492, "AP50": 94.1918, "AP75": 87.9956}
    both = {"shapes_holdout_val": {"bbox": bbox}, "shapes_val": {"bbox": {**bbox, "AP": float("nan")}}}
    assert reevaluate.eval_ap(both) == [
        {"ap": "75.95", "ap50": "94.19", "ap75": "88.00"},
        {"ap": "0.00", "ap50": "94.19", "ap75": "88.00"},  # nothing detected: AP 0
    ]
    assert reevaluate.eval_ap({"shapes_val": {"bbox": bbox}}) is None  # a split missing


def test_a_run_evaluated_on_both_weights_gets_the_trained_weights_columns(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_train_net.py"
    script.write_text(FAKE_TRAIN_NET)
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.jsonl"))
    out = tmp_path / "study"
    make_cell(out, "a")
    make_cell(out, "ema")
    rows = {"a": {"diverged": "no"}, "ema": {"diverged": "no"}}
    # a CSV an earlier version wrote, without the trained weights' columns: its rows are kept
    old_header = [f for f in reevaluate.EVAL_FIELDS if f not in reevaluate.TRAINED_FIELDS]
    csv_path = tmp_path / "eval.csv"
    csv_path.write_text(",".join(old_header) + "\nold,2000,70.00,1,1,71.00,1,1,9.0,vm\n")
    command = [sys.executable, str(script)]
    assert reevaluate.reevaluate_cells(["a", "ema"], rows, str(out), 2000, str(csv_path), command) == ["a", "ema"]
    assert "ema, 2000 images: held-out AP 62.50, reported AP 55.55; trained weights 60.00, 55.00" in capsys.readouterr().out
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == reevaluate.EVAL_FIELDS
        written = [(r["cell"], r["holdout_ap"], r["box_ap"], r["trained_holdout_ap"], r["trained_box_ap"]) for r in reader]
    assert written == [
        ("old", "70.00", "71.00", "", ""),
        ("a", "61.25", "55.55", "", ""),  # no EMA: the columns stay empty
        ("ema", "62.50", "55.55", "60.00", "55.00"),  # the average's AP, then the trained weights'
    ]
    # a CSV with other columns is not rewritten
    other = tmp_path / "other.csv"
    other.write_text("cell,images,something\n")
    with pytest.raises(ValueError, match=r"other.csv: columns \['cell', 'images', 'something'\] are not those"):
        reevaluate.append_row(str(other), {"cell": "x"}, reevaluate.EVAL_FIELDS)
    assert other.read_text() == "cell,images,something\n"
