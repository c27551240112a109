"""A fresh run never writes over another run's results: on an OUTPUT_DIR that holds
checkpoints or metrics.json records, a run without --resume stops before launch in one line
naming the folder, --resume and --overwrite; --overwrite moves the old files aside first."""

import json
import os
import subprocess
import sys

import pytest

from largedet.engine import check_and_launch, largedet_argument_parser
from largedet.launch.run_lock import PreviousRunError, claim_for_fresh_run, previous_results

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R18_FPN_sgd_bs8.yaml")


def finished_run(folder):
    """What a finished run leaves: checkpoints, their tag, two metrics records, a log."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_0000004.pth").write_bytes(b"weights")
    (folder / "model_final.pth").write_bytes(b"weights")
    (folder / "last_checkpoint").write_text("model_final.pth")
    (folder / "metrics.json").write_text(json.dumps({"iteration": 0}) + "\n" + json.dumps({"iteration": 1}) + "\n")
    (folder / "log.txt").write_text("trained\n")
    (folder / "inference").mkdir()
    return folder


def refusal(folder, found):
    return (
        f"OUTPUT_DIR {folder} holds a previous run's results ({found}); pass --resume to continue "
        f"that run, or --overwrite to start a new one (its files are moved to {folder}/overwritten_<time>/)"
    )


def test_what_counts_as_a_previous_run(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text("\n")  # created, nothing logged
    (folder / "log.txt").write_text("a failed start\n")
    (folder / "run.lock").write_text("")
    assert previous_results(str(folder)) == [] and claim_for_fresh_run(str(folder), overwrite=False) is None
    (folder / "metrics.json").write_text('{"iteration": 0}\n')
    assert previous_results(str(folder)) == ["metrics.json"]
    finished_run(folder)
    assert previous_results(str(folder)) == ["last_checkpoint", "metrics.json", "model_0000004.pth", "model_final.pth"]
    with pytest.raises(PreviousRunError) as refused:
        claim_for_fresh_run(str(folder), overwrite=False)
    assert str(refused.value) == refusal(folder, "last_checkpoint, metrics.json, model_0000004.pth and 1 more")


def test_overwrite_moves_everything_but_the_lock_aside(tmp_path):
    folder = finished_run(tmp_path / "run")
    (folder / "run.lock").write_text("")
    aside = claim_for_fresh_run(str(folder), overwrite=True)
    assert os.path.dirname(aside) == str(folder) and os.path.basename(aside).startswith("overwritten_")
    assert sorted(os.listdir(folder)) == sorted(["run.lock", os.path.basename(aside)])
    assert sorted(os.listdir(aside)) == [
        "inference", "last_checkpoint", "log.txt", "metrics.json", "model_0000004.pth", "model_final.pth"
    ]  # fmt: skip
    assert open(os.path.join(aside, "metrics.json")).read().count("iteration") == 2
    # a second overwrite leaves the first one's folder where it is
    finished_run(folder / "again").rename(folder / "again_moved")
    (folder / "metrics.json").write_text('{"iteration": 0}\n')
    second = claim_for_fresh_run(str(folder), overwrite=True)
    assert second != aside and os.path.isdir(aside) and sorted(os.listdir(second)) == ["again_moved", "metrics.json"]


@pytest.mark.parametrize(
    "flags, launched, moved",
    [([], False, False), (["--resume"], True, False), (["--eval-only"], True, False), (["--overwrite"], True, True)],
)
def test_the_check_before_launch(tmp_path, capsys, flags, launched, moved):
    """check_and_launch, with a main that records being called: refused before launch unless
    the run resumes, only evaluates, or overwrites (the old files then moved aside)."""
    folder = finished_run(tmp_path / "run")
    args = largedet_argument_parser().parse_args(["--config", CONFIG, *flags])
    calls = []

    def main(a):
        calls.append(sorted(os.listdir(folder)))

    if launched:
        check_and_launch(main, args, lambda a: None, output_dir=lambda a: str(folder))
    else:
        with pytest.raises(SystemExit) as stopped:
            check_and_launch(main, args, lambda a: None, output_dir=lambda a: str(folder))
        assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert bool(calls) == launched
    if not launched:
        found = "last_checkpoint, metrics.json, model_0000004.pth and 1 more"
        assert err == f"error: {refusal(folder, found)}\n"
    elif moved:
        aside = [n for n in calls[0] if n.startswith("overwritten_")]
        assert calls[0] == sorted(["run.lock", *aside]) and len(aside) == 1  # the run starts on an empty folder
        assert err == f"--overwrite: the previous run's files of {folder} moved to {folder / aside[0]}\n"
    else:
        assert "metrics.json" in calls[0] and "model_final.pth" in calls[0] and err == ""


def test_train_net_stops_before_building_anything(tiny_shapes, tmp_path):
    folder = finished_run(tmp_path / "run")
    before = sorted(os.listdir(folder))
    shapes = ["DATASETS.SHAPES.ROOT", tiny_shapes.root, "DATASETS.SHAPES.NUM_TRAIN", str(tiny_shapes.num_train),
              "DATASETS.SHAPES.NUM_VAL", str(tiny_shapes.num_val), "DATASETS.SHAPES.IMAGE_SIZE",
              str(tiny_shapes.image_size), "DATASETS.SHAPES.SEED", str(tiny_shapes.seed)]  # fmt: skip
    proc = subprocess.run([sys.executable, TRAIN_NET, "--config", CONFIG, *shapes, "OUTPUT_DIR", str(folder)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    found = "last_checkpoint, metrics.json, model_0000004.pth and 1 more"
    assert proc.stderr.strip().splitlines() == [f"error: {refusal(folder, found)}"]
    assert proc.stdout == ""
    assert sorted(os.listdir(folder)) == sorted([*before, "run.lock"])  # nothing written but the lock
    assert (folder / "log.txt").read_text() == "trained\n"


def test_the_lazy_script_s_folder_is_its_train_output_dir(tmp_path):
    """tools/lazyconfig_train_net.py checks (and locks) train.output_dir, overrides included."""
    import argparse

    from largedet.config.lazy import lazy_output_dir

    config = os.path.join(ROOT, "configs", "shapes", "lazy", "faster_rcnn_R18_FPN_pmdlamb_bs1024.py")
    args = argparse.Namespace(config_file=config, opts=[f"train.output_dir={tmp_path / 'lazy'}"])
    assert lazy_output_dir(args) == str(tmp_path / "lazy")
