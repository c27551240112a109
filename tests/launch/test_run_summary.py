"""``run_summary.json`` (largedet.launch.run_summary): the images per second of an invocation
count training time only, not the evaluations run during it."""

import json
import time

import pytest
from engine_testing import tiny_cfg

from largedet.engine import Trainer
from largedet.launch.run_summary import read_run_summary

EVALUATION_S = 0.5


class SlowEvaluationTrainer(Trainer):
    """Every evaluation takes at least EVALUATION_S seconds."""

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        time.sleep(EVALUATION_S)
        return {}


def test_images_per_second_leave_out_the_evaluations(tiny_shapes, tmp_path):
    # 4 steps of 4 images, evaluated after step 2 and at the end: two evaluations
    cfg = tiny_cfg(str(tmp_path), "TEST.EVAL_PERIOD", "2")
    trainer = SlowEvaluationTrainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    (invocation,) = read_run_summary(str(tmp_path))["invocations"]
    assert invocation["status"] == "finished"
    wall, evaluation = invocation["wall_clock_s"], invocation["evaluation_s"]
    assert evaluation >= 2 * EVALUATION_S
    assert evaluation == pytest.approx(trainer.evaluation.seconds, abs=1e-3)
    assert wall > evaluation
    # 16 images over the wall-clock less the evaluations; both are rounded to the nearest
    # 1 ms, so their difference is off by at most 1 ms from the training time (about 70 ms
    # here: a relative tolerance would not bound it), and images/s is rounded to 0.001
    training = wall - evaluation
    low, high = 16 / (training + 0.001) - 0.0005, 16 / (training - 0.001) + 0.0005
    assert low <= invocation["images_per_s"] <= high
    assert invocation["images_per_s"] > 16 / wall  # what counting the evaluations gave


def test_an_invocation_that_ended_without_a_word_is_recorded_as_killed(tiny_shapes, tmp_path):
    """A SIGKILL (or the out-of-memory killer) leaves the invocation ``running``: the next
    start records it as ``killed``, its steps kept up to where the next one starts."""
    import json

    from largedet.launch.run_summary import SUMMARY_FILE

    opts = ("SOLVER.MAX_ITER", 2, "SOLVER.CHECKPOINT_PERIOD", 1)
    first = Trainer(tiny_cfg(str(tmp_path), *opts))
    first.resume_or_load(resume=False)
    first.train()
    summary = read_run_summary(str(tmp_path))
    summary["invocations"][-1].update(status="running", end_iter=0)  # as a kill leaves it
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({**summary, "status": "running"}))
    resumed = Trainer(tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", 3, "SOLVER.CHECKPOINT_PERIOD", 1))
    resumed.resume_or_load(resume=True)
    resumed.train()
    summary = read_run_summary(str(tmp_path))
    assert [(r["start_iter"], r["end_iter"], r["status"]) for r in summary["invocations"]] == [
        (0, 2, "killed"), (2, 3, "finished")
    ]
    assert summary["status"] == "finished"


def test_training_seconds_leave_out_evaluation_and_untimed_invocations(tmp_path):
    from largedet.launch.run_summary import SUMMARY_FILE, training_seconds

    assert training_seconds(str(tmp_path)) is None  # no summary
    invocations = [{"wall_clock_s": 70.25, "evaluation_s": 20.0}, {"wall_clock_s": None},
                   {"wall_clock_s": 50.0}, {"wall_clock_s": 10.0, "evaluation_s": None}]  # fmt: skip
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"invocations": invocations[1:2]}))
    assert training_seconds(str(tmp_path)) is None  # none timed
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"invocations": invocations}))
    assert training_seconds(str(tmp_path)) == 70.25 - 20.0 + 50.0 + 10.0
