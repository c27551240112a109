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


def _killed_then_resumed(tmp_path, kill_at, edit=None):
    """Train 5 steps (a checkpoint every 2) killed without a word before step ``kill_at``:
    the summary is put back as it stood then (``edit`` may change it), as a SIGKILL leaves
    it; then resume to the end. Returns the final summary and the seconds from the first
    invocation's start to each of its steps' start."""
    from engine_testing import StopAt

    from largedet.launch.run_summary import SUMMARY_FILE

    opts = ("SOLVER.MAX_ITER", 5, "SOLVER.CHECKPOINT_PERIOD", 2)
    snapshot, started = {}, {}

    class Snapshot(StopAt):
        def before_train(self):
            self.t0 = time.perf_counter()

        def before_step(self):
            started[self.trainer.iter] = time.perf_counter() - self.t0
            if self.trainer.iter == self.at:
                snapshot.update(read_run_summary(str(tmp_path)))
            super().before_step()

    first = Trainer(tiny_cfg(str(tmp_path), *opts))
    first.register_hooks([Snapshot(kill_at)])
    first.resume_or_load(resume=False)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    if edit is not None:
        edit(snapshot)
    (tmp_path / SUMMARY_FILE).write_text(json.dumps(snapshot))  # what the kill left
    resumed = Trainer(tiny_cfg(str(tmp_path), *opts))
    resumed.resume_or_load(resume=True)
    resumed.train()
    return read_run_summary(str(tmp_path)), started


def test_a_killed_invocation_keeps_the_time_of_the_steps_the_next_one_resumes_after(tiny_shapes, tmp_path):
    """A SIGKILL leaves the invocation ``running``, as last recorded at its checkpoint after
    step 2 (of 0..4): the next start records it as ``killed``, its steps and wall clock kept up
    to where the next one starts."""
    from largedet.launch.run_summary import training_seconds

    summary, started = _killed_then_resumed(tmp_path, kill_at=3)
    first, second = summary["invocations"]
    assert [(r["start_iter"], r["end_iter"], r["status"]) for r in summary["invocations"]] == [
        (0, 2, "killed"), (2, 5, "finished")
    ]
    # recorded after step 1 (checkpoint 2): later than step 1's start, before step 2's (the
    # hook's clock starts before this test's, 0.1 s of slack for that)
    assert "timed_to_iter" not in first and started[1] <= first["wall_clock_s"] <= started[2] + 0.1
    assert summary["status"] == "finished"
    expected = sum(i["wall_clock_s"] - i["evaluation_s"] for i in (first, second))
    assert training_seconds(str(tmp_path)) == pytest.approx(expected)


def test_a_killed_invocation_whose_record_misses_the_resume_step_is_untimed(tiny_shapes, tmp_path):
    """Its last record stops short of the step the next one resumes at (an older summary, or
    a kill between a checkpoint and its record): its times are unknown, and so is the run's
    training time (a sum without them would leave two steps out)."""
    from largedet.launch.run_summary import training_seconds

    def older(summary):
        summary["invocations"][-1].pop("timed_to_iter")

    summary, _ = _killed_then_resumed(tmp_path, kill_at=3, edit=older)
    first = summary["invocations"][0]
    assert (first["status"], first["end_iter"]) == ("killed", 2)
    assert (first["wall_clock_s"], first["evaluation_s"], first["images_per_s"]) == (None, None, None)
    assert training_seconds(str(tmp_path)) is None
    assert summary["wall_clock_s"] == summary["invocations"][1]["wall_clock_s"]


def test_training_seconds_leave_out_evaluation_and_are_unknown_with_an_untimed_invocation(tmp_path):
    from largedet.launch.run_summary import SUMMARY_FILE, training_seconds

    assert training_seconds(str(tmp_path)) is None  # no summary
    invocations = [{"wall_clock_s": 70.25, "evaluation_s": 20.0}, {"wall_clock_s": 50.0},
                   {"wall_clock_s": 10.0, "evaluation_s": None}]  # fmt: skip
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"invocations": invocations}))
    assert training_seconds(str(tmp_path)) == 70.25 - 20.0 + 50.0 + 10.0
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"invocations": invocations + [{"wall_clock_s": None}]}))
    assert training_seconds(str(tmp_path)) is None  # one not timed: the sum would be short
