"""LazyConfig training (largedet.engine.lazy): the example LazyConfig is the same run as its
yacs twin (derived numbers, log block, LR sequence, optimizer), trains to the same weights
with the same LRs, and malformed configs are refused with the key named."""

import os

import pytest
import torch
from engine_testing import weights
from torch import nn

import largedet  # noqa: F401
from detectron2.config import LazyCall as L
from detectron2.config import LazyConfig, get_cfg
from detectron2.engine import HookBase
from detectron2.solver import WarmupParamScheduler
from detectron2.utils.env import seed_all_rng
from largedet.config import DeviceUnavailableError, add_largedet_config
from largedet.config.lazy import TRAIN_KEYS, run_config, train_defaults
from largedet.engine import Trainer
from largedet.engine.lazy import lazy_trainer
from largedet.solver.lazy import build_lazy_lr_scheduler, build_lazy_optimizer
from largedet.optim import PART_KEY
from largedet.solver import build_lr_scheduler, build_optimizer, run_plan, with_scaled_lr

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "shapes")
LAZY = os.path.join(CONFIGS, "lazy", "faster_rcnn_R18_FPN_pmdlamb_bs1024.py")
YAML = os.path.join(CONFIGS, "faster_rcnn_R18_FPN_pmdlamb_bs1024.yaml")

# The same tiny run in both languages: tiny_shapes at 64 px, 3 steps of 4 images as 2
# micro-batches of 2, warm-up 1 step, x0.1 at step 2, PMD-LAMB period 2, no evaluation.
YACS_TINY = [
    "DATASETS.TRAIN", "('tiny_shapes_train',)", "DATASETS.TEST", "()",
    "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64",
    "SOLVER.IMS_PER_BATCH", "4", "SOLVER.IMS_PER_DEVICE", "2", "SOLVER.MAX_ITER", "3",
    "SOLVER.WARMUP_ITERS", "1", "SOLVER.STEPS", "(2,)", "SOLVER.PMD.PERIOD", "2",
    "DATALOADER.NUM_WORKERS", "0", "MODEL.DEVICE", "cpu",
]  # fmt: skip
LAZY_TINY = [
    "dataloader.train.dataset.names=tiny_shapes_train",
    "dataloader.train.mapper.augmentations.0.short_edge_length=[64]",
    "dataloader.train.mapper.augmentations.0.max_size=64",
    "train.ims_per_batch=4", "train.ims_per_device=2", "train.max_iter=3", "train.warmup.iters=1",
    "lr_multiplier.milestones=[2]", "lr_multiplier.values=[1.0,0.1]", "optimizer.period=2",
    "dataloader.train.num_workers=0", "train.device=cpu",
]  # fmt: skip


def load_yaml(*opts):
    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_file(YAML)
    cfg.merge_from_list(list(opts))
    cfg.freeze()
    return cfg


def load_lazy(*overrides, test=True):
    cfg = LazyConfig.apply_overrides(LazyConfig.load(LAZY), list(overrides))
    if not test:
        del cfg.dataloader["test"]
    return cfg


def hyperparameters(optimizer, model):
    """(parameter names, hyperparameters) of each group, foreach None read as True (its meaning)."""
    names = {p: n for n, p in model.named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        hyper = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
        hyper["foreach"] = hyper["foreach"] is not False
        hyper["betas"] = tuple(hyper["betas"])
        groups.append((sorted(names[p] for p in group["params"]), hyper))
    return sorted(groups, key=lambda g: g[0])


class RecordLR(HookBase):
    """The LR of each group at each step."""

    def __init__(self):
        self.lrs = []

    def before_step(self):
        self.lrs.append([g["lr"] for g in self.trainer.optimizer.param_groups])


# --- the example is its yaml twin, at full size ----------------------------------------


def test_lazy_example_describes_the_same_run_as_its_yaml_twin():
    run, yacs = run_config(load_lazy()), load_yaml()
    for key in ("IMS_PER_BATCH", "IMS_PER_DEVICE", "MAX_ITER", "LSR", "WARMUP_ITERS",
                "WARMUP_FACTOR", "WARMUP_METHOD", "STEPS", "CHECKPOINT_PERIOD"):  # fmt: skip
        assert run.SOLVER[key] == yacs.SOLVER[key], key
    assert (run.DATASETS.TRAIN, run.DATASETS.TEST) == (yacs.DATASETS.TRAIN, yacs.DATASETS.TEST)
    # the same start-of-run block on 8 devices (K = 1024 / (8 x 16) = 8), up to the name of
    # the schedule
    lazy_block = run_plan(run, 8, 1500).describe(run, "PMDLAMB")
    yaml_block = run_plan(yacs, 8, 1500).describe(yacs, "PMDLAMB")
    assert lazy_block == yaml_block.replace("WarmupMultiStepLR", "MultiStepParamScheduler")
    assert "(SOLVER.OPTIMIZER PMD_LAMB)" in lazy_block  # the registered name, not the class's
    assert "8 accumulation step(s)" in lazy_block and "LR 0.04 = sqrt scaling rule" in lazy_block


def test_lazy_example_has_the_lr_sequence_and_optimizer_of_its_yaml_twin():
    lazy, yacs = load_lazy(), load_yaml()
    run = run_config(lazy)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))
    lazy_opt = build_lazy_optimizer(lazy, model, run, run_plan(run, 1))
    yaml_opt = build_optimizer(with_scaled_lr(yacs, run_plan(yacs, 1).lr), model)
    assert type(lazy_opt) is type(yaml_opt)
    assert hyperparameters(lazy_opt, model) == hyperparameters(yaml_opt, model)

    sequences = []
    for scheduler in (
        build_lazy_lr_scheduler(lazy, run, lazy_opt, run_plan(run, 1)),
        build_lr_scheduler(yacs, yaml_opt, run_plan(yacs, 1)),
    ):
        lrs = []
        for _ in range(run.SOLVER.MAX_ITER):
            lrs.append(scheduler.get_last_lr()[0])
            scheduler.optimizer.step()
            scheduler.step()
        sequences.append(lrs)
    assert sequences[0] == sequences[1]
    # warm-up from 0.001 x 0.04 over 60 steps, then 0.04, 0.004 from 225, 0.0004 from 275
    assert sequences[0][0] == pytest.approx(4e-5)
    assert sequences[0][60:225] == [pytest.approx(0.04)] * 165
    assert sequences[0][225] == pytest.approx(0.004) and sequences[0][299] == pytest.approx(4e-4)


# --- a few steps: the same LRs and the same weights -----------------------------------


def test_lazy_trainer_trains_like_the_yacs_trainer(tiny_shapes, tmp_path):
    results = {}
    for name, make in [
        ("yacs", lambda: Trainer(load_yaml(*YACS_TINY, "OUTPUT_DIR", str(tmp_path / "yacs")))),
        ("lazy", lambda: lazy_trainer(load_lazy(*LAZY_TINY, f"train.output_dir={tmp_path}/lazy", test=False))),
    ]:  # fmt: skip
        seed_all_rng(0)
        trainer = make()
        assert (trainer.plan.batch.accumulation, trainer.plan.batch.per_device) == (2, 2)
        initial = weights(trainer.model)
        lr = RecordLR()
        trainer.register_hooks([lr])
        trainer.train()
        results[name] = initial, weights(trainer.model), lr.lrs
    (yaml_init, yaml_final, yaml_lrs), (lazy_init, lazy_final, lazy_lrs) = (
        results["yacs"],
        results["lazy"],
    )
    assert yaml_init.keys() == lazy_init.keys()
    assert all(torch.equal(yaml_init[k], lazy_init[k]) for k in yaml_init)
    assert lazy_lrs == yaml_lrs
    # sqrt rule: 0.005 x sqrt(4 / 16) = 0.0025; step 0 warms up from 0.001 x; x0.1 from step 2
    assert [lrs[0] for lrs in lazy_lrs] == pytest.approx([2.5e-6, 0.0025, 0.00025])
    changed = [k for k in yaml_init if not torch.equal(yaml_init[k], yaml_final[k])]
    assert changed, "training changed no weight"
    assert all(torch.equal(yaml_final[k], lazy_final[k]) for k in yaml_final)


# --- the keys -----------------------------------------------------------------------------


def test_train_defaults_are_the_yacs_defaults():
    cfg = load_lazy()
    cfg.train = train_defaults()
    assert cfg.train.device == "cuda"  # Detectron2's default, as MODEL.DEVICE's
    cfg.train.device = "cpu"  # "cuda" is refused on a machine without a GPU
    run, defaults = run_config(cfg), add_largedet_config(get_cfg())
    for yacs_key in TRAIN_KEYS.values():
        value, default = run, defaults
        for part in yacs_key.split("."):
            value, default = value[part], default[part]
        assert value == default or (yacs_key == "MODEL.DEVICE" and value == "cpu"), yacs_key
    if not torch.cuda.is_available():
        cfg.train.device = "cuda"
        with pytest.raises(DeviceUnavailableError, match=r"^train.device: 'cuda' asks for a GPU, but torch "):
            run_config(cfg)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.ims_per_batchh=8", "train.ims_per_batchh: not a largedet training key"),
        ("train.max_iter=ten", "train.max_iter: expected int"),
        ("dataloader.train.sampler=none", "dataloader.train.sampler: not taken"),
        ("dataloader.train.total_batch_size=16", "total_batch_size: 16 is not train.ims_per_batch 1024"),
        (
            "dataloader.test.dataset.proposal_files=[a]",
            "dataloader.test.dataset.proposal_files: not",
        ),
    ],
)
def test_run_config_names_the_bad_key(override, message):
    with pytest.raises(ValueError, match=message):
        run_config(load_lazy(override))


def test_run_config_refuses_a_second_warmup():
    cfg = load_lazy()
    run_config(cfg)  # the example's schedule has no warm-up of its own
    cfg.lr_multiplier = L(WarmupParamScheduler)(
        scheduler=cfg.lr_multiplier, warmup_factor=0.001, warmup_length=0.2
    )
    with pytest.raises(ValueError, match="lr_multiplier: a WarmupParamScheduler and train.warmup both"):
        run_config(cfg)


def test_agvm_splits_the_lazy_param_groups_by_part():
    cfg = load_lazy("train.agvm.enabled=True")
    cfg.train.agvm.groups = [["body", "0"], ["body", "1"], ["head", "2"]]
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))
    run = run_config(cfg)
    optimizer = build_lazy_optimizer(cfg, model, run, run_plan(run, 8))
    names = {p: n for n, p in model.named_parameters()}
    parts = {names[p]: group[PART_KEY] for group in optimizer.param_groups for p in group["params"]}
    assert parts == {"0.weight": "body", "0.bias": "body", "1.weight": "body", "1.bias": "body",
                     "2.weight": "head", "2.bias": "head"}  # fmt: skip
    assert "parts" not in cfg.optimizer.params  # the config itself is left as it was


def test_the_process_group_timeout_of_a_lazy_config():
    # tools/lazyconfig_train_net.py passes it to the process group, as train_net.py its yaml's
    from argparse import Namespace

    from largedet.config.lazy import lazy_timeout_s

    default = add_largedet_config(get_cfg()).DISTRIBUTED.TIMEOUT_S
    assert lazy_timeout_s(Namespace(config_file=LAZY, opts=[])) == default
    given = Namespace(config_file=LAZY, opts=["train.distributed.timeout_s=33.5"])
    assert lazy_timeout_s(given) == 33.5 != default
