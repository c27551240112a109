"""The video batch-scaling study (study/video_batch_study.py): the grid's
arithmetic, the config each cell trains with, its CSV row, resumption."""

import csv
import json
import os
import types

import pytest
from detectron2.config import get_cfg

from largedet.solver import lr_scaling
from largedet.solver.batch import batch_plan
from largedet_video import add_video_config
from video_study import grid as study
from video_study import runner as study_runner
from study_csv import write_csv

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def cfg_of(plan, config=None):
    """``plan``'s config: the grid's file (``config``; the first grid's by default), then its overrides."""
    cfg = get_cfg()
    add_video_config(cfg)
    cfg.merge_from_file(os.path.join(ROOT, config or study.build_video_grid().config))
    cfg.merge_from_list(plan.overrides)
    return cfg


def test_every_batch_trains_the_same_epochs_with_the_papers_recipe():
    grid = study.build_video_grid()
    names = [c.name for c in grid.cells]
    assert len(names) == len(set(names))
    assert names[:3] == ["sgd-bs16", "sgd-bs256", "pmd_lamb-bs256"]
    assert {"sgd-bs16-s1", "sgd-bs256-s1", "pmd_lamb-bs256-s1", "sgd-bs64", "sgd-bs1024",
            "pmd_lamb-bs1024", "sgd-bs256-multigrid", "tsn-sgd-bs16"} <= set(names)  # fmt: skip
    for cell in grid.cells:
        plan = study.plan_video_cell(grid, cell, "/tmp/x")
        if not cell.multigrid:  # (its steps: the next test)
            assert plan.iterations * cell.batch == 30 * 4096, cell.name  # equal epochs
            assert plan.warmup == round(5 * 4096 / cell.batch)  # 5 warm-up epochs
        cfg = cfg_of(plan)
        assert lr_scaling(cfg).lr == pytest.approx(plan.lr, rel=1e-12)
        assert batch_plan(cfg, 1).accumulation == max(1, cell.batch // 16)
        assert (cfg.SOLVER.WEIGHT_DECAY, cfg.SOLVER.WEIGHT_DECAY_NORM, cfg.SOLVER.WEIGHT_DECAY_BIAS) == (1e-4, 0.0, 0.0)
        if not cell.multigrid:
            assert cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupCosineLR"
    big = study.plan_video_cell(grid, study.VideoCell("sgd", 256), "/x")
    # 6.25% of the training set per step, 16 steps an epoch (the paper: 5.1%, ~20)
    assert (big.iterations, big.warmup, big.lr) == (480, 80, pytest.approx(0.32))
    lamb = study.plan_video_cell(grid, study.VideoCell("pmd_lamb", 1024), "/x")
    assert (lamb.iterations, lamb.warmup, lamb.pmd_period, lamb.lr) == (120, 20, 30, pytest.approx(0.04))
    tsn = cfg_of(study.plan_video_cell(grid, study.VideoCell("sgd", 16, backbone="TSNResNet"), "/x"))
    assert tsn.MODEL.VIDEO.BACKBONE == "TSNResNet"


def test_the_multigrid_cell_keeps_the_epochs_on_a_step_schedule():
    grid = study.build_video_grid()
    plan = study.plan_video_cell(grid, study.VideoCell("sgd", 256, multigrid=True), "/x")
    cfg = cfg_of(plan)
    assert cfg.MULTIGRID.LONG_CYCLE and cfg.MULTIGRID.SHORT_CYCLE and cfg.MULTIGRID.EPOCH_FACTOR == 1.0
    assert cfg.SOLVER.LR_SCHEDULER_NAME == "WarmupMultiStepLR" and cfg.SOLVER.STEPS == (360, 440)
    # the long cycle takes up to 16 passes of 256 clips a step (4096: the training set), so
    # 30 epochs are 83 steps; the warm-up is its first 5 epochs' steps, not the base's 80
    from largedet_video.multigrid import build_multigrid_plan

    mg = build_multigrid_plan(cfg, 4096, 1)
    assert (plan.iterations, mg.max_iter) == (83, 83)
    assert plan.warmup == mg.first_step_of_epoch(5) == cfg.SOLVER.WARMUP_ITERS
    assert 0 < plan.warmup < 17  # inside the first stage (epochs 0-11, steps 0-16)
    first = mg.schedule.stages[0]
    assert max(s.batch_size for s in first.short_cycle_shapes) * mg.accumulation == 4096


def _fake_run(run_dir, top1=None, losses=(2.0, 1.0), status="finished", speed=100.0):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"iteration": i, "total_loss": loss}) + "\n")
        if top1 is not None:
            f.write(json.dumps({"iteration": len(losses), "classification/top1": top1}) + "\n")
    with open(os.path.join(run_dir, "run_summary.json"), "w") as f:
        json.dump({"status": status, "invocations": [{"images_per_s": speed}]}, f)


def test_summarize_reads_top1_speed_and_divergence(tmp_path):
    grid = study.build_video_grid()
    args = types.SimpleNamespace(grid_obj=grid, num_gpus=1, device_label="cpu", threads=1)
    plan = study.plan_video_cell(grid, study.VideoCell("pmd_lamb", 256, seed=1), str(tmp_path))
    _fake_run(str(tmp_path / "ok"), top1=81.2345)
    row = study_runner.summarize_video_cell(plan, str(tmp_path / "ok"), 0, 60.0, args)
    assert (row["top1"], row["batch_fraction"], row["accumulation"], row["seed"]) == ("81.23", "0.0625", 16, 1)
    assert (row["clips_per_s"], row["final_loss"], row["diverged"], row["pmd_period"]) == ("100.00", "1.0000", "no", 120)
    _fake_run(str(tmp_path / "div"), losses=(2.0, float("inf")), status="diverged")
    row = study_runner.summarize_video_cell(plan, str(tmp_path / "div"), 1, 5.0, args)
    assert (row["diverged"], row["top1"]) == ("yes", "")
    _fake_run(str(tmp_path / "noeval"))
    assert study_runner.summarize_video_cell(plan, str(tmp_path / "noeval"), 0, 5.0, args) is None
    _fake_run(str(tmp_path / "failed"), status="failed")
    assert study_runner.summarize_video_cell(plan, str(tmp_path / "failed"), 1, 5.0, args) is None


def test_study_runs_each_cell_once_and_retries_failures(tmp_path, monkeypatch, capsys):
    calls = []

    def run_cell(plan, run_dir, args):
        calls.append(plan.cell.name)
        if plan.cell.name == "sgd-bs256" and calls.count("sgd-bs256") == 1:
            return 1, "RuntimeError: killed", 1.0
        _fake_run(run_dir, top1=50.0 + len(calls))
        return 0, "", 2.0

    monkeypatch.setattr(study_runner, "run_cell", run_cell)
    out = str(tmp_path / "s")
    only = ["sgd-bs16", "sgd-bs256", "pmd_lamb-bs256"]
    assert study_runner.main(["--output-dir", out, "--only", *only]) == 1
    assert study_runner.main(["--output-dir", out, "--only", *only]) == 0
    assert calls == ["sgd-bs16", "sgd-bs256", "pmd_lamb-bs256", "sgd-bs256"]
    with open(os.path.join(out, "study.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [(r["cell"], r["top1"]) for r in rows] == [("sgd-bs16", "51.00"), ("pmd_lamb-bs256", "53.00"), ("sgd-bs256", "54.00")]
    assert list(rows[0]) == study.VIDEO_CSV_FIELDS
    capsys.readouterr()
    assert study_runner.main(["--output-dir", out, "--dry-run"]) == 0
    out_text = capsys.readouterr().out
    assert "[done] sgd-bs16 " in out_text and "[todo] sgd-bs1024 " in out_text and "batch/N 25.00%" in out_text


def test_table_and_figure_of_the_video_study(tmp_path):
    from video_study.plotting import curves, load_video_study, plot_top1_vs_batch, video_table

    path = str(tmp_path / "s.csv")
    rows = [("sgd-bs16", 16, "80.0", "no"), ("sgd-bs16-s1", 16, "82.0", "no"), ("sgd-bs256", 256, "79.5", "no"),
            ("sgd-bs1024", 1024, "", "yes"), ("pmd_lamb-bs256", 256, "81.0", "no"),
            ("sgd-bs256-multigrid", 256, "78.0", "no"), ("tsn-sgd-bs16", 16, "12.6", "no")]  # fmt: skip
    write_csv(path, study.VIDEO_CSV_FIELDS,
              [{"cell": cell, "batch": batch, "top1": top1, "diverged": div} for cell, batch, top1, div in rows])
    data = load_video_study(path)
    lines, baseline, others = curves(data)
    assert baseline == [80.0, 82.0]
    assert [(b, m) for b, m, *_ in lines["sgd"]] == [(16, 81.0), (256, 79.5), (1024, None)]
    assert others == {"sgd-bs256-multigrid": [78.0], "tsn-sgd-bs16": [12.6]}
    table = video_table(data)
    assert "| SGD, linear rule | 81.0 (2 seeds: 80.0, 82.0) | 79.5 | div. |" in table
    assert "| PMD-LAMB, square-root rule | - | 81.0 | - |" in table
    out = plot_top1_vs_batch(data, str(tmp_path / "f.png"), 4096)
    assert os.path.getsize(out) > 10_000


def test_multigrid_lrheld_cell_holds_the_base_shapes_lr():
    """tsm4k's multigrid at base batch 128: the coarsest stage is 1024 clips a step (25% of
    N); with the linear rule its LR is 8x the base's, with ``-lrheld`` the base's at every
    shape. Both share the stages and steps."""
    from largedet_video.multigrid import build_multigrid_plan

    grid = study.build_video_grid("tsm4k")
    plans = {}
    for scale in (True, False):
        cell = study.VideoCell("sgd", 128, multigrid=True, multigrid_scale_lr=scale)
        plan = study.plan_video_cell(grid, cell, "/x")
        cfg = cfg_of(plan)
        assert cfg.MULTIGRID.SCALE_LR is scale
        plans[cell.name] = (plan, build_multigrid_plan(cfg, 4096, 1))
    (scaled, mg_s), (held, mg_h) = plans["sgd-bs128-multigrid"], plans["sgd-bs128-multigrid-lrheld"]
    assert scaled.iterations == held.iterations == mg_s.max_iter == mg_h.max_iter
    first = mg_s.schedule.stages[0]
    # the stage's own (long-cycle) shape: 8x the clips, 1024 a step; its short cycle's
    # smallest crop doubles that again, 2048 a step
    assert (first.batch_size * mg_s.accumulation, first.batch_factor) == (1024, 8)
    assert max(s.batch_size for s in first.short_cycle_shapes) * mg_s.accumulation == 2048
    assert [s.relative_lr for s in mg_s.schedule.stages][:4] == [8.0, 4.0, 2.0, 1.0]
    assert [s.relative_lr for s in mg_h.schedule.stages][:4] == [1.0] * 4
    assert scaled.lr == held.lr == pytest.approx(0.16)


def test_multigrid_short_cell_runs_the_short_cycle_alone():
    """``-multigrid-short``: no long cycle, so every stage has the base shape's 8 frames and
    the base step schedule's LR; the short cycle alternates crops 16, 23, 32 with 4x, 2x
    and 1x the clips, so an epoch takes about 3/7 of the base steps (960 -> 408 at base
    128)."""
    from largedet_video.multigrid import build_multigrid_plan

    grid = study.build_video_grid("tsm4k")
    cell = study.VideoCell("sgd", 128, multigrid=True, multigrid_long_cycle=False)
    assert cell.name == "sgd-bs128-multigrid-short"
    plan = study.plan_video_cell(grid, cell, "/x")
    cfg = cfg_of(plan)
    assert (cfg.MULTIGRID.LONG_CYCLE, cfg.MULTIGRID.SHORT_CYCLE) == (False, True)
    mg = build_multigrid_plan(cfg, 4096, 1)
    assert plan.iterations == mg.max_iter
    assert {(st.num_frames, st.relative_lr) for st in mg.schedule.stages} == {(8, 1.0), (8, 0.1)}
    shapes = mg.schedule.stages[0].short_cycle_shapes
    assert [(s.crop_size, s.batch_factor) for s in shapes] == [(16, 4), (23, 2), (32, 1)]
    # per device an epoch of 4096 clips is 36 cycles of 64 + 32 + 16 clips (108 batches,
    # 4032 clips) and one batch of the 64 left: 109 batches; 30 epochs over 8 batches a step
    assert mg.epoch_batches == (109,) * 30
    assert plan.iterations == 30 * 109 // 8 == 408
    assert plan.lr == pytest.approx(0.16)


def test_a_multigrid_row_says_its_step_schedule(tmp_path):
    """tsm4k's CSV names each row's LR schedule: a multigrid cell runs the step schedule
    (its name carries no ``lrstep``), and the row says so."""
    grid = study.build_video_grid("tsm4k")
    args = types.SimpleNamespace(grid_obj=grid, num_gpus=1, device_label="cpu", threads=1)
    run = tmp_path / "mg"
    _fake_run(str(run), top1=40.0)
    with open(run / "metrics.json", "a") as f:
        f.write(json.dumps({"iteration": 3, f"{grid.holdout_set}/classification/top1": 41.0}) + "\n")
    rows = {}
    for cell in (study.VideoCell("sgd", 64, multigrid=True, multigrid_scale_lr=False),
                 study.VideoCell("sgd", 64, lr_schedule="step"), study.VideoCell("sgd", 64)):
        plan = study.plan_video_cell(grid, cell, str(tmp_path))
        rows[cell.name] = study_runner.summarize_video_cell(plan, str(run), 0, 60.0, args)
    assert {n: r["lr_schedule"] for n, r in rows.items()} == {
        "sgd-bs64-multigrid-lrheld": "step", "sgd-bs64-lrstep": "step", "sgd-bs64": "cosine"}
    assert rows["sgd-bs64-multigrid-lrheld"]["holdout_top1"] == "41.00"


def test_train_seconds_leave_out_evaluation_over_every_invocation(tmp_path):
    """``train_s``: each invocation's wall clock less its evaluation, summed (a resumed run
    has several); "" without a summary, or where one invocation is untimed (killed between a
    checkpoint and its record: the sum would leave its steps out)."""
    run = tmp_path / "r"
    _fake_run(str(run))
    assert study_runner.train_seconds(str(run)) == ""
    invocations = [{"wall_clock_s": 100.25, "evaluation_s": 30.0, "status": "preempted"},
                   {"wall_clock_s": 50.0, "evaluation_s": None, "status": "finished"}]
    with open(run / "run_summary.json", "w") as f:
        json.dump({"status": "finished", "invocations": invocations}, f)
    assert study_runner.train_seconds(str(run)) == "120.2"  # 70.25 + 50, to 0.1 s
    untimed = {"wall_clock_s": None, "evaluation_s": None, "status": "killed"}
    with open(run / "run_summary.json", "w") as f:
        json.dump({"status": "finished", "invocations": [untimed] + invocations}, f)
    assert study_runner.train_seconds(str(run)) == ""
    assert study.VIDEO_HOLDOUT_CSV_FIELDS[-1] == "train_s"


def test_mg_time_grid_three_seeds_of_four_schedules_at_two_budgets():
    """``mg_time``: the plain step schedule and the three multigrid schedules at base batch
    128 (the long cycle's LR held at the base shape's), three seeds each, at the base epochs,
    then at a second budget (half the epochs for the plain schedule, twice for multigrid);
    every seed 0 before a seed 1; tsm4k's splits; the linear rule's two long-cycle seed-0
    cells last."""
    from largedet_video.multigrid import build_multigrid_plan

    grid = study.build_video_grid("mg_time")
    names = [c.name for c in grid.cells]
    assert len(names) == len(set(names)) == 26
    assert names[:4] == ["sgd-bs128-lrstep", "sgd-bs128-multigrid-lrheld", "sgd-bs128-multigrid-long-lrheld",
                         "sgd-bs128-multigrid-short"]  # fmt: skip
    assert names[12:16] == ["sgd-bs128-ep0.5x-lrstep", "sgd-bs128-multigrid-lrheld-ep2x",
                            "sgd-bs128-multigrid-long-lrheld-ep2x", "sgd-bs128-multigrid-short-ep2x"]  # fmt: skip
    assert names[24:] == ["sgd-bs128-multigrid", "sgd-bs128-multigrid-long"]
    assert {n for n in names if n.endswith("-s2")} == {n + "-s2" for n in names[:4] + names[12:16]}
    assert grid.holdout_set == study.build_video_grid("tsm4k").holdout_set and grid.stage_columns
    for cell in grid.cells[:24]:
        cfg = cfg_of(study.plan_video_cell(grid, cell, "/x"))
        assert cfg.MULTIGRID.SCALE_LR is (not (cell.multigrid and cell.multigrid_long_cycle)), cell.name
    for cell in grid.cells[24:]:
        assert cfg_of(study.plan_video_cell(grid, cell, "/x")).MULTIGRID.SCALE_LR is True
    long_only = study.plan_video_cell(grid, grid.cells[2], "/x")
    cfg = cfg_of(long_only)
    assert (cfg.MULTIGRID.LONG_CYCLE, cfg.MULTIGRID.SHORT_CYCLE) == (True, False)
    mg = build_multigrid_plan(cfg, 4096, 1)
    # the long cycle alone: one shape per stage
    assert all(len(st.short_cycle_shapes) == 1 for st in mg.schedule.stages)
    assert long_only.iterations == mg.max_iter
    plain_half = study.plan_video_cell(grid, grid.cells[12], "/x")
    assert (plain_half.iterations, plain_half.steps) == (480, (360, 440))


def test_mg_time64_grid_is_mg_time16s_design_on_the_64px_task():
    """``mg_time64``: base batch 16 on 2048 videos of 16 frames at 64 px x 15 epochs (1920
    plain steps), the plain schedule and the long cycle alone first (three seeds each), then
    the other schedules and each curve's second point; evaluated on 2 views a video."""
    from largedet_video.multigrid import build_multigrid_plan

    big = study.build_video_grid("mg_time64")
    names = [c.name for c in big.cells]
    assert names[:6] == [n + s for s in ("", "-s1", "-s2") for n in ("sgd-bs16-lrstep", "sgd-bs16-multigrid-long")]
    assert len(names) == len(set(names)) == 18 and big.config.endswith("16f-64px.yaml")
    assert {n.rsplit("-s", 1)[0] if n[-3:-1] == "-s" else n for n in names} == {
        "sgd-bs16-lrstep", "sgd-bs16-multigrid-long", "sgd-bs16-multigrid", "sgd-bs16-multigrid-short",
        "sgd-bs16-ep0.5x-lrstep", "sgd-bs16-multigrid-long-ep2x"}  # fmt: skip
    plain = study.plan_video_cell(big, big.cells[0], "/x")
    assert plain.iterations == 15 * 2048 // 16 == 1920
    cfg = cfg_of(plain, big.config)
    assert (cfg.INPUT.VIDEO.NUM_FRAMES, cfg.INPUT.VIDEO.TRAIN_CROP_SIZE, cfg.DATASETS.MOVING_SHAPES.NUM_TRAIN) == (16, 64, 2048)
    assert (cfg.INPUT.VIDEO.TEST_NUM_CLIPS, cfg.INPUT.VIDEO.TEST_NUM_CROPS) == (2, 1)
    assert cfg.DATASETS.MOVING_SHAPES.NUM_VAL == 4096 and big.holdout_set == study.build_video_grid("mg_time").holdout_set
    # the long cycle's coarsest shape: 8x the base clips (128, 6% of N) at a quarter of the frames
    long_cfg = cfg_of(study.plan_video_cell(big, big.cells[1], "/x"), big.config)
    stages = build_multigrid_plan(long_cfg, 2048, 1).schedule.stages
    coarsest = max(stages, key=lambda st: st.batch_factor)
    assert (coarsest.batch_size, coarsest.num_frames) == (128, 4) and long_cfg.MULTIGRID.SCALE_LR


def test_mg_time16_grid_runs_the_papers_linear_rule_at_base_batch_16():
    """``mg_time16``: the mg_time task at base batch 16, the plain step schedule and the three
    multigrid schedules with the linear rule (MULTIGRID.SCALE_LR on), three seeds each, every
    seed 0 first, then the plain schedule at half the epochs, the long cycle with every frame
    kept and the long cycle at twice the epochs; its coarsest long-cycle shape is 8x the base
    batch, 128 clips (3% of N), at 8x the base LR."""
    from largedet_video.multigrid import build_multigrid_plan

    grid = study.build_video_grid("mg_time16")
    names = [c.name for c in grid.cells]
    assert names[:4] == ["sgd-bs16-lrstep", "sgd-bs16-multigrid", "sgd-bs16-multigrid-long", "sgd-bs16-multigrid-short"]
    assert names[4:12] == [n + s for s in ("-s1", "-s2") for n in names[:4]]
    assert names[12:15] == ["sgd-bs16-ep0.5x-lrstep", "sgd-bs16-ep0.5x-lrstep-s1", "sgd-bs16-ep0.5x-lrstep-s2"]
    assert names[15:18] == ["sgd-bs16-multigrid-long-keepframes" + s for s in ("", "-s1", "-s2")]
    # the long cycle alone at twice the epochs, its curve's second point: 2x the base epochs'
    # steps of each shape, give or take a stage's rounding
    assert names[18:] == ["sgd-bs16-multigrid-long-ep2x" + s for s in ("", "-s1", "-s2")]
    long1, long2 = (study.plan_video_cell(grid, grid.cells[i], "/x") for i in (2, 18))
    assert 2 * long1.iterations - 8 <= long2.iterations <= 2 * long1.iterations + 200
    assert not cfg_of(long2).MULTIGRID.SHORT_CYCLE and cfg_of(long2).MULTIGRID.LONG_CYCLE
    # the long cycle with every frame kept: 8 frames at every stage, the crop alone shrinks to
    # the paper's voxels per clip (32 x sqrt(1/8) = 11 px at 8x the clips)
    keep = cfg_of(study.plan_video_cell(grid, grid.cells[15], "/x"))
    stages = build_multigrid_plan(keep, 4096, 1).schedule.stages
    assert {st.num_frames for st in stages} == {8} and not keep.MULTIGRID.SHORT_CYCLE
    assert sorted({(st.crop_size, st.batch_factor) for st in stages}) == [(11, 8), (16, 4), (23, 2), (32, 1)]
    assert grid.stage_columns and grid.holdout_set == study.build_video_grid("mg_time").holdout_set
    plain = study.plan_video_cell(grid, grid.cells[0], "/x")
    assert (plain.iterations, plain.lr) == (30 * 4096 // 16, pytest.approx(0.02))
    full = study.plan_video_cell(grid, grid.cells[1], "/x")
    cfg = cfg_of(full)
    assert cfg.MULTIGRID.SCALE_LR is True and (cfg.MULTIGRID.LONG_CYCLE, cfg.MULTIGRID.SHORT_CYCLE) == (True, True)
    mg = build_multigrid_plan(cfg, 4096, 1)
    assert full.iterations == mg.max_iter < plain.iterations
    # the coarsest long-cycle shape: 8x the base batch's clips, 128 a step
    assert max(st.batch_factor for st in mg.schedule.stages) == 8
    assert max(st.batch_size for st in mg.schedule.stages) == 128


def test_stage_columns_sum_the_invocations(tmp_path):
    """An ``mg_time`` row carries the steps', data's and precise BN's seconds of every
    invocation's stage_times.json."""
    from largedet_video.engine.stage_times import append_stage_times

    grid = study.build_video_grid("mg_time")
    args = types.SimpleNamespace(grid_obj=grid, num_gpus=1, device_label="cpu", threads=1)
    run = tmp_path / "mg"
    _fake_run(str(run), top1=40.0)
    with open(run / "metrics.json", "a") as f:
        f.write(json.dumps({"iteration": 3, f"{grid.holdout_set}/classification/top1": 41.0}) + "\n")
    plan = study.plan_video_cell(grid, grid.cells[3], str(tmp_path))
    row = study_runner.summarize_video_cell(plan, str(run), 0, 60.0, args)
    assert (row["step_s"], row["data_s"], row["precise_bn_s"]) == ("", "", "")
    append_stage_times(str(run), {"step_s": 10.04, "data_s": 1.0, "precise_bn_s": 2.5})
    append_stage_times(str(run), {"step_s": 5.0, "data_s": 0.52, "precise_bn_s": 0.0})
    row = study_runner.summarize_video_cell(plan, str(run), 0, 60.0, args)
    assert (row["step_s"], row["data_s"], row["precise_bn_s"]) == ("15.0", "1.5", "2.5")
    # a third invocation in the run summary without its stage times (killed): the sums are unknown
    with open(run / "run_summary.json", "w") as f:
        json.dump({"status": "finished", "invocations": [{"images_per_s": 100.0}] * 3}, f)
    row = study_runner.summarize_video_cell(plan, str(run), 0, 60.0, args)
    assert (row["step_s"], row["data_s"], row["precise_bn_s"]) == ("", "", "")
    assert list(study.VIDEO_STAGE_CSV_FIELDS[-6:]) == ["step_s", "data_s", "precise_bn_s", "started_utc",
                                                      "probe_ms_min", "probe_ms_max"]  # fmt: skip
    assert (row["started_utc"], row["probe_ms_min"], row["probe_ms_max"]) == ("", "", "")


def test_a_timed_grid_probes_the_machine_around_each_invocation(tmp_path, monkeypatch):
    """``mg_time``: the speed probe runs just before and just after each training invocation;
    a cell starting from step 0 forgets an earlier attempt's probes, a resumed one keeps them;
    the row carries the first start and the probes' range. ``tsm4k`` (no stage columns)
    probes nothing."""
    from largedet_study import speed_probe

    calls = []
    monkeypatch.setattr(study_runner, "train", lambda overrides, run_dir, args: (calls.append("train"), (0, "", 1.0))[1])
    values = iter([20.0, 22.5, 30.0, 19.0, 21.0])

    def probe(run_dir, when, threads):
        calls.append(when)
        return speed_probe.record(run_dir, when, threads=threads, ms=next(values))

    grid = study.build_video_grid("mg_time")
    args = types.SimpleNamespace(grid_obj=grid, num_gpus=1, device_label="cpu", threads=1)
    plan = study.plan_video_cell(grid, grid.cells[1], str(tmp_path))
    run = str(tmp_path / "mg")
    assert study_runner.run_cell(plan, run, args, probe=probe) == (0, "", 1.0)
    assert calls == ["start", "train", "end"]
    assert [e["ms"] for e in speed_probe.read(run)] == [20.0, 22.5]
    # no checkpoint yet: a new attempt starts from step 0 and its probes replace those
    study_runner.run_cell(plan, run, args, probe=probe)
    assert [e["ms"] for e in speed_probe.read(run)] == [30.0, 19.0]
    # resumed (a checkpoint is there): the probes of both invocations count
    open(os.path.join(run, "last_checkpoint"), "w").close()
    values = iter([25.0])
    study_runner.run_cell(plan, run, args, probe=lambda d, w, threads: speed_probe.record(d, w, ms=next(values, 18.5)))
    entries = speed_probe.read(run)
    assert [(e["when"], e["ms"]) for e in entries] == [("start", 30.0), ("end", 19.0), ("start", 25.0), ("end", 18.5)]
    cols = speed_probe.row_columns(run)
    assert (cols["probe_ms_min"], cols["probe_ms_max"]) == ("18.500", "30.000")
    assert cols["started_utc"] == entries[0]["utc"] and cols["started_utc"].endswith("Z")

    calls.clear()
    plain = study.build_video_grid("tsm4k")
    args = types.SimpleNamespace(grid_obj=plain, num_gpus=1, device_label="cpu", threads=1)
    other = str(tmp_path / "plain")
    study_runner.run_cell(study.plan_video_cell(plain, plain.cells[0], str(tmp_path)), other, args, probe=probe)
    assert calls == ["train"] and speed_probe.read(other) == []
