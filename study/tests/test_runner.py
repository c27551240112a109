"""largedet_study (study/batch_scaling_study.py): the grids, the plan of each cell, its
CSV row, resumption."""

import csv
import json
import math
import os
import sys
import types

import pytest

import largedet  # noqa: F401
from detectron2.config import get_cfg
from largedet.config import add_largedet_config
from largedet.solver.batch import batch_plan
from largedet.solver import lr_scaling
from largedet_study import grid as schema
from largedet_study import runner

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.fixture(scope="module")
def study():
    return runner


def cfg_of(study, plan, grid="short"):
    """The config the study's run would train with: the base yaml plus the overrides."""
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(os.path.join(ROOT, study.build_grid(grid).config))
    cfg.merge_from_list(plan.overrides)
    return cfg


def test_short_grid_has_every_optimizer_at_every_batch_and_the_extra_cells(study):
    grid = study.build_grid("short")
    names = [c.name for c in grid.cells]
    assert len(names) == len(set(names))
    for opt in ("sgd", "lamb", "pmd_lamb", "lars", "adamw"):
        for batch in (16, 64, 256, 1024):
            assert f"{opt}-bs{batch}" in names
    # period/decay sweep at the largest batch; AGVM at the two largest for SGD, PMD-LAMB, AdamW
    assert {
        "pmd_lamb-bs1024-T3-cosine",
        "pmd_lamb-bs1024-T12-cosine",
        "pmd_lamb-bs1024-T6-linear",
        "pmd_lamb-bs256-T12-cosine",
        "pmd_lamb-bs256-T48-cosine",
        "pmd_lamb-bs256-T24-linear",
    } <= set(names)
    for opt in ("sgd", "pmd_lamb", "adamw"):
        assert {f"{opt}-bs1024-agvm", f"{opt}-bs256-agvm"} <= set(names)


@pytest.mark.parametrize(
    "optimizer, batch, lr, iterations, warmup, steps, period",
    [
        # 16 epochs x 1536 images; LR: SGD 0.02 x B/16, the others sqrt(B/16) x reference;
        # warm-up 2 epochs (>= 3 steps); x0.1 at 3/4 and 11/12; PMD period = iterations / 4
        ("sgd", 16, 0.02, 1536, 192, (1152, 1408), None),
        ("sgd", 1024, 0.02 * 64, 24, 3, (18, 22), None),
        ("pmd_lamb", 256, 0.01 * 4, 96, 12, (72, 88), 24),
        ("lamb", 64, 0.01 * 2, 384, 48, (288, 352), None),
        ("lars", 1024, 1.0 * 8, 24, 3, (18, 22), None),
        ("adamw", 256, 1e-3 * 4, 96, 12, (72, 88), None),
    ],
)
def test_plan_arithmetic_and_the_config_it_produces(
    study, optimizer, batch, lr, iterations, warmup, steps, period
):
    plan = study.plan_cell(
        study.build_grid("short"), schema.Cell(optimizer, batch), 2.0, "/tmp/x", world=1
    )
    assert plan.iterations == iterations and plan.warmup == warmup and plan.steps == steps
    assert plan.lr == pytest.approx(lr, rel=1e-12)
    assert plan.pmd_period == period
    # the overrides make largedet's own LR scaling, batch plan and schedule agree
    cfg = cfg_of(study, plan)
    assert lr_scaling(cfg).lr == pytest.approx(lr, rel=1e-12)
    assert cfg.SOLVER.OPTIMIZER == schema.OPTIMIZERS[optimizer].name
    assert study.build_grid("short").recipe(optimizer) == schema.OPTIMIZERS[optimizer]
    assert cfg.SOLVER.MAX_ITER * cfg.SOLVER.IMS_PER_BATCH == 16 * 1536
    assert batch_plan(cfg, 1).accumulation == batch // min(16, batch)
    assert tuple(cfg.SOLVER.STEPS) == steps and cfg.SOLVER.WARMUP_ITERS == warmup
    if period:
        assert cfg.SOLVER.PMD.PERIOD == period


def test_agvm_and_sweep_cells_override_what_they_name(study):
    grid = study.build_grid("short")
    plan = study.plan_cell(
        grid,
        schema.Cell("pmd_lamb", 1024, pmd_period=3, pmd_decay="linear", agvm=True),
        2.0,
        "/tmp/x",
        1,
    )
    cfg = cfg_of(study, plan)
    assert (
        cfg.SOLVER.PMD.PERIOD == 3 and cfg.SOLVER.PMD.DECAY == "linear" and cfg.SOLVER.AGVM.ENABLED
    )
    assert plan.cell.name == "pmd_lamb-bs1024-T3-linear-agvm"


def fake_run(run_dir, ap=None, losses=(2.0, 1.5), speed=None, status="finished", batch=64):
    """A run's metrics.json and run_summary.json (``speed``: seconds per step of ``batch``
    images; ``status``: how it ended)."""
    os.makedirs(run_dir, exist_ok=True)
    invocation = {"images_per_s": None if speed is None else batch / speed, "status": status}
    with open(os.path.join(run_dir, "run_summary.json"), "w") as f:
        json.dump({"status": status, "invocations": [invocation]}, f)
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"iteration": i, "total_loss": loss, "lr": 0.1}) + "\n")
        if ap is not None:
            f.write(
                json.dumps(
                    {
                        "iteration": len(losses) - 1,
                        "bbox/AP": ap,
                        "bbox/AP50": ap + 10,
                        "bbox/AP75": ap - 5,
                    }
                )
                + "\n"
            )


def test_summarize_reads_ap_speed_and_divergence(study, tmp_path):
    args = types.SimpleNamespace(
        num_gpus=1, grid_obj=study.build_grid("short"), device_label="cpu", threads=1
    )
    plan = study.plan_cell(args.grid_obj, schema.Cell("lamb", 64), 2.0, str(tmp_path), 1)
    fake_run(str(tmp_path / "ok"), ap=41.234, speed=0.5)
    row = study.summarize(plan, str(tmp_path / "ok"), 0, 100.0, args)
    assert row["box_ap"] == "41.23" and row["ap50"] == "51.23" and row["ap75"] == "36.23"
    assert row["images_per_s"] == "128.00"  # 64 images in 0.5 s
    assert row["diverged"] == "no" and row["final_loss"] == "1.5000" and row["accumulation"] == 4
    # a run stopped by a non-finite loss is a result, with no AP
    fake_run(str(tmp_path / "div"), losses=(2.0, math.inf), status="diverged")
    row = study.summarize(plan, str(tmp_path / "div"), 1, 5.0, args)
    assert row["diverged"] == "yes" and row["box_ap"] == ""
    # a model that detects nothing: Detectron2 writes NaN, the COCO AP is 0
    fake_run(str(tmp_path / "empty"), ap=math.nan, speed=0.5)
    row = study.summarize(plan, str(tmp_path / "empty"), 0, 100.0, args)
    assert row["box_ap"] == "0.00" and row["diverged"] == "no"
    # a run that ended without evaluating is not a row
    fake_run(str(tmp_path / "noeval"), ap=None, speed=0.5)
    assert study.summarize(plan, str(tmp_path / "noeval"), 0, 100.0, args) is None
    # any other failure is not a row (it is retried)
    fake_run(str(tmp_path / "failed"), losses=(2.0, 1.0), status="failed")
    assert study.summarize(plan, str(tmp_path / "failed"), 1, 5.0, args) is None


def test_study_resumes_and_skips_finished_cells(study, tmp_path, monkeypatch):
    calls = []

    weights_seen = set()

    def run_cell(plan, run_dir, args):
        calls.append(plan.cell.name)
        weights_seen.add(plan.overrides[plan.overrides.index("MODEL.WEIGHTS") + 1])
        if plan.cell.name == "adamw-bs1024" and len(calls) < 10:
            return 1, "RuntimeError: killed", 1.0  # fails the first time
        fake_run(run_dir, ap=10.0 + len(calls), speed=1.0)
        return 0, "Overall training speed: 20 iterations in 0:00:09 (1.0 s / it)", 2.0

    monkeypatch.setattr(study, "run_cell", run_cell)
    monkeypatch.setattr(study, "ensure_pretrained", lambda args: "/weights/backbone.pth")
    out = str(tmp_path / "study")
    only = ["sgd-bs1024", "adamw-bs1024", "sgd-bs256"]
    assert study.main(["--grid", "short", "--output-dir", out, "--only", *only]) == 1  # one failure
    with open(os.path.join(out, "study.csv")) as f:
        assert [r["cell"] for r in csv.DictReader(f)] == ["sgd-bs1024", "sgd-bs256"]
    calls.extend(["pad"] * 10)
    assert study.main(["--grid", "short", "--output-dir", out, "--only", *only]) == 0
    assert calls[-1] == "adamw-bs1024"  # only the failed cell ran again
    with open(os.path.join(out, "study.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["cell"] for r in rows] == ["sgd-bs1024", "sgd-bs256", "adamw-bs1024"]
    assert weights_seen == {"/weights/backbone.pth"}  # every cell starts from the pretrained ResNet
    assert not any(name.endswith(".lock") for _, _, files in os.walk(out) for name in files)


def test_unknown_cell_is_an_error(study, tmp_path, capsys):
    with pytest.raises(SystemExit):
        study.main(["--output-dir", str(tmp_path), "--only", "sgd-bs3"])
    assert "unknown cells ['sgd-bs3']" in capsys.readouterr().err


def test_a_lock_of_a_dead_process_is_taken_over(study, tmp_path):
    lock = str(tmp_path / "cell.lock")
    assert study.claim(lock)
    assert not study.claim(lock)  # held by this (live) process
    with open(lock, "w") as f:
        f.write("999999999")  # no such process
    assert study.claim(lock)


def test_pretrained_backbone_keeps_only_the_resnet_and_is_made_once(study, tmp_path, monkeypatch):
    import torch

    runs = []

    def train(overrides, run_dir, args):
        runs.append(list(overrides))
        model = {"backbone.bottom_up.stem.conv1.weight": torch.ones(2), "backbone.fpn_lateral2.weight": torch.ones(1),
                 "roi_heads.box_predictor.cls_score.weight": torch.ones(3)}  # fmt: skip
        torch.save({"model": model, "iteration": 9}, os.path.join(run_dir, "model_final.pth"))
        return 0, "", 1.0

    monkeypatch.setattr(study, "train", train)
    args = types.SimpleNamespace(grid_obj=study.build_grid("short"), output_dir=str(tmp_path))
    path = study.ensure_pretrained(args)
    saved = torch.load(path)["model"]
    assert list(saved) == ["backbone.bottom_up.stem.conv1.weight"]
    # trained on another split of the data: seed 1000, no evaluation
    assert runs[0][runs[0].index("DATASETS.SHAPES.SEED") + 1] == "1000"
    assert study.ensure_pretrained(args) == path and len(runs) == 1


@pytest.mark.parametrize(
    "name, optimizer, batch, lr_factor",
    [
        ("sgd_bs64", "sgd", 64, 1.0),
        ("lamb_bs256", "lamb", 256, 0.5),
        ("pmdlamb_bs256", "pmd_lamb", 256, 1.0),
        ("lars_bs256", "lars", 256, 1.0),
        ("adamw_bs256", "adamw", 256, 1.0),
    ],
)
def test_recommended_configs_are_the_study_cells_they_came_from(
    study, name, optimizer, batch, lr_factor
):
    path = os.path.join(
        ROOT, "configs", "shapes", "study", f"faster_rcnn_R10w16_FPN_64px_{name}.yaml"
    )
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(path)
    plan = study.plan_cell(
        study.build_grid("short"), schema.Cell(optimizer, batch, lr_factor=lr_factor), 2.0, "/tmp/x", 1
    )
    cell = cfg_of(study, plan)
    assert lr_scaling(cfg).lr == pytest.approx(plan.lr, rel=1e-12)
    for key in (
        "OPTIMIZER",
        "IMS_PER_BATCH",
        "MAX_ITER",
        "WARMUP_ITERS",
        "STEPS",
        "WEIGHT_DECAY",
        "ADAPT_NORM",
    ):
        assert cfg.SOLVER[key] == cell.SOLVER[key], key
    if optimizer == "pmd_lamb":
        assert cfg.SOLVER.PMD.PERIOD == cell.SOLVER.PMD.PERIOD


def test_steps_grid_gives_every_batch_the_same_epochs_and_batch_1024_300_steps(study):
    grid = study.build_grid("steps")
    names = [c.name for c in grid.cells]
    assert len(names) == len(set(names))
    required = {
        "sgd-bs16-wu2", "sgd-bs256", "sgd-bs1024", "pmd_lamb-bs256", "pmd_lamb-bs1024",
        "lamb-bs1024", "adamw-bs1024", "pmd_lamb-bs1024-agvm", "pmd_lamb-bs1024-ep1.4x",
        "pmd_lamb-bs1024-lrx0.5", "pmd_lamb-bs1024-lrx2", "pmd_lamb-bs1024-wu20",
        "pmd_lamb-bs1024-wu80", "sgd-bs16-wu2-s1", "pmd_lamb-bs1024-s1",
    }  # fmt: skip
    assert required <= set(names)
    for cell in grid.cells:
        plan = study.plan_cell(grid, cell, None, "/tmp/x", 1)
        images = plan.iterations * cell.batch
        # the same 200 epochs of 1536 images for every cell, 1.4x for the longer schedule
        assert images == round(200 * cell.epochs_factor) * 1536, cell.name
        if cell.batch == 1024:
            assert plan.iterations >= 300, cell.name
        cfg = cfg_of(study, plan)
        assert cfg.DATASETS.TEST == ("shapes_holdout_val", "shapes_val")
        assert lr_scaling(cfg).lr == pytest.approx(plan.lr, rel=1e-12)


@pytest.mark.parametrize(
    "cell, lr, iterations, warmup, period",
    [
        # warm-up 40 epochs = 40 x 1536 / B steps; the baseline's 2 epochs
        (("sgd", 16, {"warmup_epochs": 2}), 0.02, 19200, 192, None),
        (("sgd", 1024, {}), 1.28, 300, 60, None),
        # adaptive: sqrt rule from 0.005 at batch 16
        (("pmd_lamb", 1024, {}), 0.04, 300, 60, 75),
        (("pmd_lamb", 256, {}), 0.02, 1200, 240, 300),
        (("pmd_lamb", 1024, {"epochs_factor": 1.4}), 0.04, 420, 60, 105),
        (("pmd_lamb", 1024, {"warmup_epochs": 80}), 0.04, 300, 120, 75),
        (("pmd_lamb", 1024, {"lr_factor": 2.0}), 0.08, 300, 60, 75),
        (("adamw", 1024, {}), 5e-4 * 8, 300, 60, None),
    ],
)
def test_steps_grid_plan_arithmetic(study, cell, lr, iterations, warmup, period):
    optimizer, batch, extra = cell
    plan = study.plan_cell(study.build_grid("steps"), schema.Cell(optimizer, batch, **extra), None, "/x", 1)
    assert (plan.lr, plan.iterations, plan.warmup, plan.pmd_period) == (
        pytest.approx(lr, rel=1e-12), iterations, warmup, period
    )
    assert plan.steps == (round(iterations * 3 / 4), round(iterations * 11 / 12))


def test_cosine_cell_anneals_the_lr_from_the_peak_to_zero(study):
    import torch
    from largedet.solver import build_lr_scheduler, run_plan

    cell = schema.Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="cosine")
    assert cell.name == "pmd_lamb-bs1024-ep1.4x-lrcosine"
    plan = study.plan_cell(study.build_grid("steps"), cell, None, "/x", 1)
    assert (plan.iterations, plan.warmup, plan.steps) == (420, 60, None)
    cfg = cfg_of(study, plan)
    assert cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupCosineLR" and cfg.SOLVER.STEPS == ()
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=plan.lr)
    scheduler = build_lr_scheduler(cfg, optimizer, run_plan(cfg, 1))
    lrs = []
    for _ in range(plan.iterations):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # after the warm-up: 0.04 x (1 + cos(pi t / 420)) / 2, Detectron2's cosine over the run
    for t in (60, 210, 300, 419):
        assert lrs[t] == pytest.approx(0.04 * (1 + math.cos(math.pi * t / 420)) / 2, rel=1e-9), t
    # a cell without lr_schedule keeps Detectron2's step schedule
    step = study.plan_cell(study.build_grid("steps"), schema.Cell("pmd_lamb", 1024), None, "/x", 1)
    assert cfg_of(study, step).SOLVER.LR_SCHEDULER_NAME == "WarmupMultiStepLR"
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        study.plan_cell(study.build_grid("steps"), schema.Cell("pmd_lamb", 1024, lr_schedule="poly"), None, "/x", 1)


def test_summarize_reads_the_held_out_and_the_reported_split(study, tmp_path):
    args = types.SimpleNamespace(
        num_gpus=1, grid_obj=study.build_grid("steps"), device_label="cpu", threads=1
    )
    plan = study.plan_cell(args.grid_obj, schema.Cell("pmd_lamb", 1024), None, str(tmp_path), 1)
    run_dir = str(tmp_path / "run")
    fake_run(run_dir)
    with open(os.path.join(run_dir, "metrics.json"), "a") as f:
        row = {"iteration": 299}
        for name, ap in (("shapes_holdout_val", 61.5), ("shapes_val", 63.25)):
            row.update({f"{name}/bbox/AP": ap, f"{name}/bbox/AP50": ap + 20, f"{name}/bbox/AP75": ap + 1})
        f.write(json.dumps(row) + "\n")
    row = study.summarize(plan, run_dir, 0, 10.0, args)
    assert (row["box_ap"], row["ap50"], row["ap75"]) == ("63.25", "83.25", "64.25")
    assert (row["holdout_ap"], row["holdout_ap50"]) == ("61.50", "81.50")
    assert row["warmup_epochs"] == "40" and row["epochs"] == "200" and row["lr_factor"] == "1"
    # a run evaluated on one set has no held-out AP (Detectron2 then drops the set's name)
    fake_run(str(tmp_path / "one"), ap=50.0)
    row = study.summarize(plan, str(tmp_path / "one"), 0, 10.0, args)
    assert row["box_ap"] == "50.00" and row["holdout_ap"] == ""


def test_wall_clock_adds_up_over_resumed_invocations(study, tmp_path, monkeypatch):
    script = tmp_path / "fake_train.py"
    script.write_text("import time; time.sleep(0.3)\n")
    monkeypatch.setattr(study, "TRAIN_COMMAND", (sys.executable, str(script)))
    args = types.SimpleNamespace(grid_obj=study.build_grid("steps"), num_gpus=1, threads=1)
    run_dir = str(tmp_path / "cell")
    _, _, first = study.train([], run_dir, args)
    assert 0.3 <= first < 120
    # an interrupted run that left a checkpoint: the next invocation adds to it
    open(os.path.join(run_dir, "last_checkpoint"), "w").write("model_0000009.pth")
    _, text, total = study.train([], run_dir, args)
    assert total >= first + 0.3 and "--resume" in text
    assert float(open(os.path.join(run_dir, study.WALL_CLOCK_FILE)).read()) == pytest.approx(total, abs=0.1)
    # a fresh start (no checkpoint) starts the count again: a count far above any run's is not added to
    os.remove(os.path.join(run_dir, "last_checkpoint"))
    open(os.path.join(run_dir, study.WALL_CLOCK_FILE), "w").write("100000.0")
    _, _, again = study.train([], run_dir, args)
    assert 0.3 <= again < 100000.0


def test_a_cell_stopped_before_its_first_checkpoint_starts_clean(study, tmp_path, monkeypatch):
    # the trainer refuses a fresh run on a folder holding results: the runner clears the records
    # of an attempt that left no checkpoint, and keeps those of one that did
    script = tmp_path / "fake_train.py"
    script.write_text("import os, sys; print(sorted(os.listdir(sys.argv[-1])))\n")
    monkeypatch.setattr(study, "TRAIN_COMMAND", (sys.executable, str(script)))
    args = types.SimpleNamespace(grid_obj=study.build_grid("steps"), num_gpus=1, threads=1)
    run_dir = tmp_path / "cell"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text('{"iteration": 3}\n')
    (run_dir / "model_0000003.pth").write_bytes(b"x")
    _, text, _ = study.train([str(run_dir)], str(run_dir), args)
    assert "--resume" not in text and "metrics.json" not in text and "model_0000003.pth" not in text
    (run_dir / "metrics.json").write_text('{"iteration": 3}\n')
    (run_dir / "last_checkpoint").write_text("model_0000003.pth")
    (run_dir / "model_0000003.pth").write_bytes(b"x")
    _, text, _ = study.train([str(run_dir)], str(run_dir), args)
    assert "--resume" in text and "metrics.json" in text and "model_0000003.pth" in text


def test_archive_copies_config_and_metrics(study, tmp_path):
    run_dir = tmp_path / "run"
    fake_run(str(run_dir), ap=1.0)
    (run_dir / "config.yaml").write_text("SOLVER: {}\n")
    (run_dir / "model_final.pth").write_bytes(b"x")
    study.archive_cell(str(run_dir), str(tmp_path / "archive" / "cell"))
    assert sorted(os.listdir(tmp_path / "archive" / "cell")) == ["config.yaml", "metrics.json"]


@pytest.mark.parametrize(
    "name, kind",
    [
        ("sgd-bs16-wu2", "main"),  # the steps grid's baseline
        ("pmd_lamb-bs1024", "main"),
        ("lars-bs64", "main"),  # the short grid's
        ("pmd_lamb-bs1024-agvm", "agvm"),
        ("sgd-bs256-agvm", "agvm"),
        ("pmd_lamb-bs1024-lrx2", "extra"),
        ("sgd-bs16-wu2-s1", "extra"),
        ("pmd_lamb-bs1024-ep1.4x", "extra"),
        ("sgd-bs16", "main"),
        ("nothing-bs3", "extra"),
    ],
)
def test_cell_kind_of_every_grid(name, kind):
    assert schema.cell_kind(name) == kind


# the steps grid's recipe config at batch 1024 and the study row it reproduces
STEPS_RECIPE = ("faster_rcnn_R10w16_FPN_64px_pmdlamb_bs1024.yaml", "pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01")


def test_steps_recipe_config_is_the_archived_run_key_for_key():
    import yaml

    name, cell = STEPS_RECIPE
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(os.path.join(ROOT, "configs", "shapes", "study", name))
    mine = yaml.safe_load(cfg.dump())
    runs = os.path.join(ROOT, "study", "results", "batch_scaling_steps_runs")
    with open(os.path.join(runs, cell, "config.yaml")) as f:
        ran = yaml.safe_load(f)
    # what differs: where the run wrote and read its files, and the device it resolved to
    for key in ("OUTPUT_DIR",):
        mine.pop(key), ran.pop(key)
    assert os.path.basename(ran["MODEL"].pop("WEIGHTS")) == os.path.basename(
        mine["MODEL"].pop("WEIGHTS")
    ) == "backbone.pth"
    assert (mine["MODEL"].pop("DEVICE"), ran["MODEL"].pop("DEVICE")) == ("auto", "cpu")
    # keys the library gained after the run (the run's dump holds every key of its day, so a
    # key it lacks is a later default) and the signals that pre-empt a run (SIGINT joined
    # them later); every key the run had must match
    def drop_new(a, b):
        for key in [k for k in a if k not in b]:
            a.pop(key)
        for key, value in a.items():
            if isinstance(value, dict) and isinstance(b[key], dict):
                drop_new(value, b[key])

    drop_new(mine, ran)
    mine.pop("PREEMPTION"), ran.pop("PREEMPTION")
    # the recipe's two changes against the earlier 1.4x rows
    assert mine["SOLVER"]["LR_SCHEDULER_NAME"] == "WarmupStableDecayLR" and mine["SOLVER"]["WEIGHT_DECAY"] == 0.01
    assert mine == ran
    # and the row it names is in the study's CSVs, with the AP the config's header states (its
    # generated block: 2000 images of each split)
    with open(os.path.join(ROOT, "study", "results", "batch_scaling_steps_eval2000.csv")) as f:
        row = next(r for r in csv.DictReader(f) if r["cell"] == cell)
    with open(os.path.join(ROOT, "configs", "shapes", "study", name)) as f:
        header = f.read().replace("\n# ", " ")
    assert f"this run (seed 0) {row['box_ap']} shapes_val, {row['holdout_ap']} held-out" in header


def test_gpu_grid_is_steps_matched_and_downloads_nothing(study):
    grid = study.build_grid("gpu")
    names = [c.name for c in grid.cells]
    assert names[:4] == ["sgd-bs16-wu0.75", "pmd_lamb-bs1024", "sgd-bs1024", "pmd_lamb-bs1024-ep1.4x"]
    assert len(names) == len(set(names))
    for cell in grid.cells:
        plan = study.plan_cell(grid, cell, None, "/tmp/x", 1)
        # 75 epochs of 4096 images for every batch (1.4x for the longer schedule)
        assert plan.iterations * cell.batch == round(75 * cell.epochs_factor) * 4096, cell.name
        if cell.batch == 1024:
            assert plan.iterations >= 300 and plan.warmup == 60, cell.name
        cfg = cfg_of(study, plan, "gpu")
        assert (cfg.INPUT.MIN_SIZE_TRAIN, cfg.DATASETS.SHAPES.IMAGE_SIZE) == ((128,), 128)
        assert cfg.SOLVER.AMP.ENABLED and cfg.SOLVER.IMS_PER_DEVICE == 16
        assert cfg.DATASETS.TEST == ("shapes_holdout_val", "shapes_val")
        assert "://" not in cfg.MODEL.WEIGHTS
    # the baseline's warm-up is Detectron2's 192 steps; the backbone is pre-trained on
    # another split (seed 1000) with a batch-16 SGD schedule of its own, no test set
    assert study.plan_cell(grid, grid.cells[0], None, "/tmp/x", 1).warmup == 192
    pre = dict(zip(grid.pretrain[::2], grid.pretrain[1::2]))
    assert pre["DATASETS.SHAPES.SEED"] == "1000" and pre["DATASETS.TEST"] == "()"
    assert pre["SOLVER.OPTIMIZER"] == "SGD" and pre["SOLVER.IMS_PER_BATCH"] == "16"
    assert not any("://" in value for value in grid.extra_overrides + grid.pretrain)


def test_a_terminated_study_stops_its_training_process(tmp_path):
    """SIGTERM to the study (``timeout``) stops the cell's training run too, so that the next
    invocation does not train the same cell beside an orphan."""
    import signal
    import subprocess
    import sys
    import time

    fake = tmp_path / "fake_train_net.py"
    pid_file = tmp_path / "child.pid"
    fake.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    driver = (
        "import sys, types\n"
        "from largedet_study import runner\n"
        f"runner.TRAIN_COMMAND = (sys.executable, {str(fake)!r})\n"
        "runner.signal.signal(runner.signal.SIGTERM, runner._interrupt_on_sigterm)\n"
        "args = types.SimpleNamespace(grid_obj=runner.build_grid('steps'), num_gpus=1, threads=1)\n"
        f"runner.train([], {str(tmp_path / 'run')!r}, args)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT)
    deadline = time.monotonic() + 300  # the driver imports torch: slow on a busy machine
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    child = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) != 0
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the training process is gone (reaped by the study)
    assert float((tmp_path / "run" / "study_wall_clock_s").read_text()) > 0


def test_wsd_cell_holds_the_peak_to_80_percent_then_decays_linearly(study):
    import torch
    from largedet.solver import build_lr_scheduler, run_plan

    cell = schema.Cell("pmd_lamb", 1024, epochs_factor=1.4, lr_schedule="wsd")
    assert cell.name == "pmd_lamb-bs1024-ep1.4x-lrwsd"
    plan = study.plan_cell(study.build_grid("steps"), cell, None, "/x", 1)
    cfg = cfg_of(study, plan)
    assert cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupStableDecayLR" and cfg.SOLVER.BASE_LR_END == 0.0
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=plan.lr)
    scheduler = build_lr_scheduler(cfg, optimizer, run_plan(cfg, 1))
    lrs = []
    for _ in range(plan.iterations):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # 420 steps: the peak 0.04 from the warm-up's end (60) to step 336 (80%), then
    # 0.04 x (420 - t) / 84 down to 0
    assert lrs[60] == lrs[200] == lrs[335] == pytest.approx(0.04, rel=1e-12)
    for t in (336, 378, 419):
        assert lrs[t] == pytest.approx(0.04 * (420 - t) / 84, rel=1e-9), t


def test_axis_cells_override_what_they_name(study):
    from largedet.solver.batch import batch_schedule
    from largedet.engine.ema import ModelEMA

    grid = study.build_grid("steps")
    names = {c.name: c for c in grid.cells}

    def cfg_for(name):
        return cfg_of(study, study.plan_cell(grid, names[name], None, "/x", 1), "steps")

    assert cfg_for("pmd_lamb-bs1024-ep1.4x-wd0.01").SOLVER.WEIGHT_DECAY == 0.01
    assert cfg_for("pmd_lamb-bs1024-ep1.4x").SOLVER.WEIGHT_DECAY == 1e-4
    beta = cfg_for("pmd_lamb-bs1024-ep1.4x-lrx2-b20.95")
    assert tuple(beta.SOLVER.LAMB.BETAS) == (0.9, 0.95) and beta.SOLVER.LSR.REFERENCE_LR == 0.01
    ema = cfg_for("pmd_lamb-bs1024-ep1.4x-ema0.9998")
    assert ema.MODEL_EMA.ENABLED and ema.MODEL_EMA.EVAL == "both"
    assert ModelEMA(torch_module(), ema.MODEL_EMA.DECAY, ema.MODEL_EMA.REFERENCE_BATCH).decay_at(1024) == 0.9998**64
    ramp = cfg_for("pmd_lamb-bs1024-ep1.4x-ramp256e28-512e56")
    schedule = batch_schedule(batch_plan(ramp, 1), ramp.SOLVER.MAX_ITER, ramp.SOLVER.BATCH_RAMP.BATCHES,
                              ramp.SOLVER.BATCH_RAMP.EPOCHS, dataset_size=1536)  # fmt: skip
    # 280 epochs of 1536 images: 28 at 256 (168 steps), 28 at 512 (84), 224 at 1024 (336)
    assert [(s.batch, s.accumulation, s.steps) for s in schedule.stages] == [(256, 16, 168), (512, 32, 84), (1024, 64, 336)]
    assert schedule.images_before(schedule.total_steps) == 280 * 1536


def torch_module():
    import torch

    return torch.nn.Linear(2, 2)


def settings(overrides):
    """A plan's overrides as a dict, each key set once (a key set twice would hide a change)."""
    pairs = list(zip(overrides[::2], overrides[1::2]))
    assert len(dict(pairs)) == len(pairs), "a key set twice would hide a change"
    return dict(pairs)


def test_regime_grid_matches_largedet_on_coco_in_batch_over_n_and_epochs(study):
    """The regime grid stands to its data as LargeDet's batch 1056 stands to COCO: the large
    batch about 1% of the training set, 12 epochs at 1.0x and about 17 at 1.4x; the steps
    grid's detector, pre-training and test splits, 2000 images each."""
    grid, steps = study.build_grid("regime"), study.build_grid("steps")
    assert (grid.config, grid.pretrain, grid.optimizers) == (steps.config, steps.pretrain, steps.optimizers)
    names = [c.name for c in grid.cells]
    assert len(names) == len(set(names))
    assert names[0] == "sgd-bs16-wu0.65"
    n = grid.num_train
    coco = 1056 / 117266
    for cell in grid.cells:
        plan = study.plan_cell(grid, cell, None, "/tmp/x", 1)
        epochs = plan.iterations * cell.batch / n
        # equal epochs for every batch, to within one step's rounding
        assert abs(epochs - 12 * cell.epochs_factor) <= cell.batch / n / 2 + 1e-12, cell.name
        if cell.batch == 256:
            assert 0.9 * coco < cell.batch / n < 1.2 * coco
            assert plan.iterations == {1.0: 1152, 1.4: 1613, 2.0: 2304}[cell.epochs_factor]
            # 2.4 epochs (20% of the 1.0x run: 230 steps) unless the cell sets its own (x2: 4.8)
            assert plan.warmup == round((cell.warmup_epochs or 2.4) * n / 256), cell.name
        cfg = cfg_of(study, plan, "regime")
        assert cfg.DATASETS.SHAPES.NUM_TRAIN == 24576 and cfg.DATASETS.SHAPES.NUM_VAL == 2000
        assert cfg.DATASETS.TEST == ("shapes_holdout_val", "shapes_val")
        assert lr_scaling(cfg).lr == pytest.approx(plan.lr, rel=1e-12)
    # the baseline: Detectron2's 1000-step warm-up at batch 16, 12 epochs
    base = study.plan_cell(grid, grid.cells[0], None, "/tmp/x", 1)
    assert (base.iterations, base.warmup, base.lr) == (18432, 998, 0.02)
    # the cells: both recipes at 1.0x and 1.4x with two seeds, SGD + linear rule at
    # 256 (one seed), PMD-LAMB at 4x the batch at 1.0x and 1.4x
    for recipe in ("", "-lrwsd-wd0.01"):
        for ep in ("", "-ep1.4x"):
            for seed in ("", "-s1"):
                assert f"pmd_lamb-bs256{ep}{recipe}{seed}" in names
    assert {"sgd-bs256", "sgd-bs16-wu0.65-s1", "pmd_lamb-bs1024-lrwsd-wd0.01",
            "pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01"} <= set(names)  # fmt: skip
    # the configs' recipe at 1.0x, level with the baseline within the seed spread: three seeds
    third = study.plan_cell(grid, grid.cells[names.index("pmd_lamb-bs256-lrwsd-wd0.01-s2")], None, "/tmp/x", 1)
    first = study.plan_cell(grid, grid.cells[names.index("pmd_lamb-bs256-lrwsd-wd0.01")], None, "/tmp/x", 1)
    i = third.overrides.index("SEED")
    assert third.overrides[i + 1] == "2" and "SEED" not in first.overrides  # seed 0: the default
    assert third.overrides[:i] + third.overrides[i + 2 :] == first.overrides
    # does the steps grid's turn past 1.7x hold at 1% of the data? the recipe at 2x, which
    # differs from its 1.4x row only in what scales with the run: steps, PMD period (a
    # quarter of the run), checkpoint period
    two = study.plan_cell(grid, grid.cells[names.index("pmd_lamb-bs256-ep2x-lrwsd-wd0.01")], None, "/tmp/x", 1)
    row = study.plan_cell(grid, grid.cells[names.index("pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01")], None, "/tmp/x", 1)
    two_s, row_s = settings(two.overrides), settings(row.overrides)
    assert set(two_s) == set(row_s)
    assert {k: v for k, v in two_s.items() if row_s[k] != v} == {
        "SOLVER.MAX_ITER": "2304", "SOLVER.PMD.PERIOD": "576", "SOLVER.CHECKPOINT_PERIOD": "230"}  # fmt: skip
    # and its second and third seeds differ from it in the seed only
    for seed in (1, 2):
        other = study.plan_cell(grid, grid.cells[names.index(f"pmd_lamb-bs256-ep2x-lrwsd-wd0.01-s{seed}")], None, "/tmp/x", 1)
        assert settings(other.overrides) == dict(two_s, SEED=str(seed))


def test_regime_axes_each_change_one_thing_against_the_large_batch_1_4x_row(study):
    """The gap of 4x the batch at 1.4x is above 1.0 AP, so the regime grid tries the steps
    grid's axes there: LR x1.5, a batch ramp over the first 20% of the epochs, model EMA;
    each cell's overrides are the 1.4x row's plus its own change, at equal images."""
    grid = study.build_grid("regime")
    by_name = {c.name: c for c in grid.cells}
    row = study.plan_cell(grid, by_name["pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01"], None, "/tmp/x", 1)
    row_plan = schema.cell_run_plan(grid.config, row.overrides, 1, grid.num_train)

    def plan_of(name):
        plan = study.plan_cell(grid, by_name[name], None, "/tmp/x", 1)
        return plan, schema.cell_run_plan(grid.config, plan.overrides, 1, grid.num_train)

    base = settings(row.overrides)
    lr, lr_plan = plan_of("pmd_lamb-bs1024-ep1.4x-lrx1.5-lrwsd-wd0.01")
    changed = {k: v for k, v in settings(lr.overrides).items() if base.get(k) != v}
    assert set(base) <= set(settings(lr.overrides))  # nothing of the row dropped
    assert changed == {"SOLVER.LSR.REFERENCE_LR": repr(0.005 * 1.5)}
    assert lr_plan.lr.lr == pytest.approx(0.06, rel=1e-12)  # 0.005 x sqrt(1024 / 16) x 1.5

    ramp, ramp_plan = plan_of("pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01-ramp256e1.68-512e3.36")
    changed = {k: v for k, v in settings(ramp.overrides).items() if base.get(k) != v}
    assert set(base) <= set(settings(ramp.overrides))  # nothing of the row dropped
    assert changed == {"SOLVER.BATCH_RAMP.BATCHES": "(256, 512,)", "SOLVER.BATCH_RAMP.EPOCHS": "(1.68, 3.36,)"}
    # 1.68 epochs at 256 (161.28 steps -> 162), to 3.36 at 512 (80.64 more -> 81), the rest at 1024
    assert ramp_plan.total_steps == 162 + 81 + 322 == 565
    assert ramp_plan.total_images == row_plan.total_images == 403 * 1024

    ema, _ = plan_of("pmd_lamb-bs1024-ep1.4x-lrwsd-wd0.01-ema0.9998")
    changed = {k: v for k, v in settings(ema.overrides).items() if base.get(k) != v}
    assert set(base) <= set(settings(ema.overrides))  # nothing of the row dropped
    assert changed == {"MODEL_EMA.ENABLED": "True", "MODEL_EMA.DECAY": "0.9998",
                       "MODEL_EMA.REFERENCE_BATCH": "16", "MODEL_EMA.EVAL": "both"}  # fmt: skip


def test_the_steps_grid_still_refuses_a_fraction_of_a_batch(study):
    grid = study.build_grid("steps")
    with pytest.raises(ValueError, match="not a whole number of batches"):
        study.plan_cell(grid, schema.Cell("pmd_lamb", 1024, epochs_factor=1.005), None, "/x", 1)
    regime = study.build_grid("regime")
    # the regime grid rounds to the nearest step: 16.8 x 24576 / 1024 = 403.2 -> 403
    assert study.plan_cell(regime, schema.Cell("pmd_lamb", 1024, epochs_factor=1.4), None, "/x", 1).iterations == 403


def test_dry_run_prints_n_batch_over_n_and_epochs(study, tmp_path, capsys):
    assert study.main(["--grid", "regime", "--output-dir", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "N = 24576 training images" in out
    line = next(l for l in out.splitlines() if "pmd_lamb-bs256-ep1.4x-lrwsd-wd0.01 " in l)
    assert "batch/N  1.04%" in line and "epochs   16.8" in line and "iterations  1613" in line


def test_set_adds_an_override_to_every_cell_and_a_misspelt_key_fails_first(study, tmp_path, monkeypatch, capsys):
    seen = []

    def run_cell(plan, run_dir, args):
        seen.append(plan.overrides)
        fake_run(run_dir, ap=50.0, speed=1.0)
        return 0, "Overall training speed: 20 iterations in 0:00:09 (1.0 s / it)", 2.0

    monkeypatch.setattr(study, "run_cell", run_cell)
    monkeypatch.setattr(study, "ensure_pretrained", lambda args: "/weights/backbone.pth")
    out = str(tmp_path / "study")
    with pytest.raises(SystemExit) as e:
        study.main(["--grid", "short", "--output-dir", out, "--only", "sgd-bs256",
                    "--set", "DATALOADER.NUM_WORKRS", "2"])  # fmt: skip
    assert e.value.code == 2 and "--set: " in capsys.readouterr().err and not seen
    assert study.main(["--grid", "short", "--output-dir", out, "--only", "sgd-bs256", "sgd-bs1024",
                       "--set", "DATALOADER.NUM_WORKERS", "2", "--set", "SEED", "7"]) == 0  # fmt: skip
    assert len(seen) == 2
    for overrides in seen:
        cfg = cfg_of(study, types.SimpleNamespace(overrides=overrides))
        assert cfg.DATALOADER.NUM_WORKERS == 2 and cfg.SEED == 7


def test_cell_numbers_are_shared_by_the_detection_and_video_plans():
    """One derivation of a cell's steps, warm-up, per-device batch, PMD period and LR drops
    serves both studies: a video cell's plan carries exactly the numbers of
    :func:`cell_numbers`, and those are the arithmetic written out here."""
    from video_study.grid import VIDEO_LR_SCHEDULES, VideoCell, build_video_grid, plan_video_cell

    grid = build_video_grid("tsm4k")
    cell = VideoCell("pmd_lamb", 256, epochs_factor=1.4, lr_schedule="step")
    numbers = schema.cell_numbers(grid, cell, 4, warmup_epochs=None, schedules=VIDEO_LR_SCHEDULES,
                                  min_warmup=1, step_drops=True)  # fmt: skip
    iterations = round(grid.epochs * 1.4 * grid.num_train) // 256
    assert numbers.iterations == iterations
    assert numbers.warmup == min(iterations // 2, max(1, round(grid.warmup_epochs * grid.num_train / 256)))
    assert numbers.per_device == min(grid.ims_per_device, 256 // 4) == 16  # K = 4 on 4 processes
    assert numbers.pmd_period == iterations // 4
    assert numbers.steps == (round(iterations * 3 / 4), round(iterations * 11 / 12))
    plan = plan_video_cell(grid, cell, "/x", 4)
    assert (plan.iterations, plan.warmup, plan.pmd_period, plan.steps, plan.per_device) == (
        numbers.iterations, numbers.warmup, numbers.pmd_period, numbers.steps, numbers.per_device)  # fmt: skip
    with pytest.raises(ValueError, match="sgd-bs16.*lr_schedule must be one of"):
        schema.cell_numbers(grid, VideoCell("sgd", 16, lr_schedule="poly"), 1, warmup_epochs=None,
                            schedules=VIDEO_LR_SCHEDULES, min_warmup=1, step_drops=False)  # fmt: skip
