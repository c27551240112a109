"""Every config error of a run at once: the collector of the checks before launch, the
overrides merged past a bad one, every broken rule, and a LazyConfig's misspelt keys and
LazyCall arguments named with the closest valid one."""

import os

import pytest
from detectron2.config import LazyConfig, get_cfg

from largedet.config import add_largedet_config
from largedet.config.errors import ConfigError, ConfigErrors, ErrorCollector, error_lines
from largedet.config.lazy import TRAIN_KEYS, lr_schedule_within_run, run_config
from largedet.config.lazy_checks import call_argument_errors, unknown_train_key, with_train_names
from largedet.config.validate import check_values, merge_checked

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LAZY = os.path.join(ROOT, "configs", "shapes", "lazy", "faster_rcnn_R18_FPN_pmdlamb_bs1024.py")


def test_the_collector_raises_one_error_or_all_of_them_once_each():
    errors = ErrorCollector()
    with errors.check():
        raise ConfigError("A: bad")
    with pytest.raises(ConfigError) as one:
        errors.raise_if_any()
    assert type(one.value) is ConfigError and str(one.value) == "A: bad"
    with errors.check():
        raise ConfigErrors(["B: bad", "A: bad"])
    with pytest.raises(ConfigErrors) as raised:
        errors.raise_if_any()
    assert raised.value.messages == ("A: bad", "B: bad")
    assert error_lines(raised.value) == ["A: bad", "B: bad"]
    with pytest.raises(KeyError):  # not a config error: not swallowed
        with ErrorCollector().check():
            raise KeyError("x")


def test_merge_reports_every_bad_override_and_merges_the_others():
    opts = ["SOLVER.BASE_LRR", "0.1", "SOLVER.MAX_ITER", "ten", "SOLVER.BASE_LR", "1"]
    with pytest.raises(ConfigErrors) as raised:
        merge_checked(add_largedet_config(get_cfg()), None, opts)
    assert raised.value.messages == (
        "SOLVER.BASE_LRR: no such config key; did you mean SOLVER.BASE_LR?",
        "SOLVER.MAX_ITER: expected an integer, got 'ten'",
    )
    errors = ErrorCollector()
    cfg = add_largedet_config(get_cfg())
    assert merge_checked(cfg, None, opts, errors=errors) == ["SOLVER.BASE_LR", "1.0"]
    assert cfg.SOLVER.BASE_LR == 1.0 and len(errors.messages) == 2


def test_check_values_names_every_broken_rule():
    cfg = add_largedet_config(get_cfg())
    cfg.SOLVER.MAX_ITER, cfg.SOLVER.PMD.PERIOD = 0, 0
    with pytest.raises(ConfigErrors) as raised:
        check_values(cfg)
    assert [m.split(":")[0] for m in raised.value.messages] == ["SOLVER.MAX_ITER", "SOLVER.PMD.PERIOD"]


def test_lazy_keys_and_arguments_are_named_with_the_closest_one():
    cfg = LazyConfig.apply_overrides(
        LazyConfig.load(LAZY), ["train.max_iterr=5", "optimizer.perod=5", "optimizer.params.base_lrr=1"]
    )
    assert call_argument_errors(cfg) == [
        "optimizer.perod: not an argument of PMDLAMB; did you mean period?",
        "optimizer.params.base_lrr: not an argument of optimizer_param_groups; did you mean base_lr?",
    ]
    with pytest.raises(ValueError, match=r"^train.max_iterr: not a largedet training key; did you mean train.max_iter\?$"):
        run_config(cfg)
    errors = ErrorCollector(catch=(ValueError,))
    run = run_config(cfg, errors)  # the bad key recorded, the rest of the run read
    assert errors.messages == [unknown_train_key("max_iterr", TRAIN_KEYS)] and run.SOLVER.MAX_ITER == 300
    assert call_argument_errors(LazyConfig.load(LAZY)) == []  # the example's own arguments all exist
    assert unknown_train_key("zzz", TRAIN_KEYS).endswith("(the keys: largedet.config.lazy.TRAIN_KEYS, docs/reference)")
    assert with_train_names("SOLVER.MAX_ITER: must be", TRAIN_KEYS) == "train.max_iter (SOLVER.MAX_ITER): must be"
    assert with_train_names("MODEL.PIXEL_MEAN: must be", TRAIN_KEYS) == "MODEL.PIXEL_MEAN: must be"


def test_a_lazy_schedule_drops_the_milestones_past_the_run_as_the_yacs_path(caplog):
    cfg = LazyConfig.apply_overrides(LazyConfig.load(LAZY), ["train.max_iter=6"])
    schedule = lr_schedule_within_run(cfg)
    assert [schedule(i / 6) for i in range(6)] == [1.0] * 6
    assert "milestones (225, 275) past the run's 6 steps (train.max_iter) are ignored" in caplog.text
    assert list(cfg.lr_multiplier.milestones) == [225, 275]  # the config itself unchanged
    cut = lr_schedule_within_run(LazyConfig.apply_overrides(LazyConfig.load(LAZY), ["train.max_iter=250"]))
    assert cut(0.5) == 1.0 and cut(0.95) == pytest.approx(0.1)
