"""The start-of-run block names each LR schedule by what it does: steps only where the
schedule has steps."""

from detectron2.config import get_cfg

from largedet.config import add_largedet_config
from largedet.solver import run_plan


def block(*opts):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list(["SOLVER.IMS_PER_BATCH", 16, "SOLVER.MAX_ITER", 100, *opts])
    return run_plan(cfg, 1, 160).describe(cfg, "SGD")


def test_a_cosine_schedule_has_no_steps():
    text = block("SOLVER.LR_SCHEDULER_NAME", "WarmupCosineLR", "SOLVER.BASE_LR_END", 0.001)
    assert "steps" not in text.split("\n")[3]
    assert "WarmupCosineLR: cosine from the peak LR to 0.001 at the run's end" in text


def test_a_step_schedule_names_its_steps():
    assert "WarmupMultiStepLR with steps (60, 80)" in block("SOLVER.STEPS", (60, 80))
    text = block("SOLVER.LR_SCHEDULER_NAME", "WarmupStepWithFixedGammaLR", "SOLVER.NUM_DECAYS", 3)
    assert "x 0.1 at 3 evenly spaced steps" in text and "(30000," not in text
