"""Model EMA (largedet.engine.ema): the average against its closed form, once per optimizer
step (not per micro-batch) in the trainer, in full precision and bfloat16, kept in
checkpoints and restored bit-exactly by a resume, and evaluated in place of the weights."""

import argparse
import json

import pytest
import torch
from detectron2.data import DatasetCatalog
from detectron2.engine import HookBase
from detectron2.structures import Boxes, Instances
from detectron2.utils.env import seed_all_rng
from engine_testing import StopAt, tiny_cfg, weights
from torch import nn

from largedet.engine import Trainer, train_or_evaluate
from largedet.engine.ema import TRAINED_WEIGHTS_DIR, ModelEMA, evaluate_with_ema, per_step_decay


def closed_form(sequence, d):
    """ema_n of weights w_0..w_n: d^n w_0 + sum_t (1 - d) d^(n - t) w_t, in float64."""
    n = len(sequence) - 1
    out = sequence[0].double() * d**n
    for t in range(1, n + 1):
        out = out + (1 - d) * d ** (n - t) * sequence[t].double()
    return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)


def test_per_step_decay_scales_with_the_batch():
    assert per_step_decay(0.9998, 1024, 16) == 0.9998**64
    assert per_step_decay(0.9, 16, 16) == 0.9
    assert per_step_decay(0.9, 1024, 0) == 0.9  # reference batch 0: the decay per step
    # a decay of 1 is refused once, by the key's declared rule (before launch, by the trainer)
    from detectron2.config import get_cfg

    from largedet.config import add_largedet_config
    from largedet.config.validate import ConfigError, check_values

    cfg = add_largedet_config(get_cfg())
    cfg.merge_from_list(["MODEL_EMA.ENABLED", True, "MODEL_EMA.DECAY", 1.0])
    with pytest.raises(ConfigError, match="MODEL_EMA.DECAY"):
        check_values(cfg)


@pytest.mark.parametrize("buffers", ["average", "copy"])
def test_average_matches_the_closed_form(buffers):
    torch.manual_seed(0)
    net = Net().double()
    ema = ModelEMA(net, decay=0.99, reference_batch=16, buffers=buffers)
    ema.reset(net)
    d = 0.99 ** (64 / 16)
    params, means = [net.linear.weight.detach().clone()], [net.bn.running_mean.clone()]
    for step in range(5):
        with torch.no_grad():
            net.linear.weight.copy_(torch.randn(2, 3, dtype=torch.float64))
            net.bn.running_mean.copy_(torch.randn(2, dtype=torch.float64))
            net.bn.num_batches_tracked.fill_(step + 1)
        params.append(net.linear.weight.detach().clone())
        means.append(net.bn.running_mean.clone())
        ema.update(net, batch=64)
    torch.testing.assert_close(ema.weights["linear.weight"], closed_form(params, d), rtol=1e-12, atol=1e-12)
    expected_mean = closed_form(means, d) if buffers == "average" else means[-1]
    torch.testing.assert_close(ema.weights["bn.running_mean"], expected_mean, rtol=1e-12, atol=1e-12)
    assert ema.weights["bn.num_batches_tracked"].item() == 5 and ema.updates == 5


def test_applied_swaps_the_weights_in_and_back():
    net = Net()
    ema = ModelEMA(net, decay=0.5, reference_batch=0)
    ema.reset(net)
    trained = weights(net)
    with torch.no_grad():
        ema.weights["linear.bias"].fill_(7.0)

    def test(cfg, model):
        return {"bias": float(model.linear.bias.sum())}

    cfg = tiny_cfg("/tmp/unused")
    assert evaluate_with_ema(test, cfg, net, ema, "ema") == {"bias": 14.0}
    assert evaluate_with_ema(test, cfg, net, ema, "model") == {"bias": float(trained["linear.bias"].sum())}
    both = evaluate_with_ema(test, cfg, net, ema, "both")
    assert both == {"bias": 14.0, "model/bias": float(trained["linear.bias"].sum())}
    assert all(torch.equal(v, trained[k]) for k, v in weights(net).items())
    with pytest.raises(ValueError, match="MODEL_EMA.EVAL"):
        evaluate_with_ema(test, cfg, net, ema, "best")


def test_both_evaluations_write_their_own_results_file(tiny_shapes, tmp_path):
    """With "both" the trained weights' COCO results go to OUTPUT_DIR/model/inference and
    leave the average's OUTPUT_DIR/inference/coco_instances_results.json as it wrote it."""
    net = Net()
    with torch.no_grad():
        net.linear.bias.fill_(0.25)  # the trained weights' score
    ema = ModelEMA(net, decay=0.5, reference_batch=0)
    ema.reset(net)
    with torch.no_grad():
        ema.weights["linear.bias"].fill_(0.75)  # the average's score
    dataset = DatasetCatalog.get("tiny_shapes_val")

    def test(cfg, model):
        # Trainer.test's evaluator, given one box per image scored by the weights
        evaluator = Trainer.build_evaluator(cfg, "tiny_shapes_val")
        evaluator.reset()
        for d in dataset:
            found = Instances((d["height"], d["width"]))
            found.pred_boxes = Boxes(torch.tensor([[0.0, 0.0, 32.0, 32.0]]))
            found.scores = torch.tensor([float(model.linear.bias[0])])
            found.pred_classes = torch.tensor([0])
            evaluator.process([d], [{"instances": found}])
        return evaluator.evaluate()

    cfg = tiny_cfg(str(tmp_path), "DATASETS.TEST", "('tiny_shapes_val',)")
    results = evaluate_with_ema(test, cfg, net, ema, "both")
    assert "bbox" in results and "model/bbox" in results

    def scores(path):
        return {round(r["score"], 6) for r in json.loads(path.read_text())}

    average_file = tmp_path / "inference" / "coco_instances_results.json"
    trained_file = tmp_path / TRAINED_WEIGHTS_DIR / "inference" / "coco_instances_results.json"
    assert scores(average_file) == {0.75}
    assert scores(trained_file) == {0.25}


class RecordWeights(HookBase):
    """The model's weights after every optimizer step (and before the first)."""

    def __init__(self):
        self.seen = []

    def before_train(self):
        self.seen.append(weights(self.trainer.model))

    def after_step(self):
        self.seen.append(weights(self.trainer.model))


EMA_OPTS = ("MODEL_EMA.ENABLED", "True", "MODEL_EMA.DECAY", "0.8", "MODEL_EMA.REFERENCE_BATCH", "2")


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_trainer_averages_once_per_optimizer_step(tiny_shapes, tmp_path, amp):
    # 4 images per step in 2 micro-batches of 2: per-step decay 0.8 ** (4 / 2) = 0.64
    opts = [*EMA_OPTS, "SOLVER.IMS_PER_DEVICE", "2", "SOLVER.MAX_ITER", "5"]
    if amp:
        opts += ["SOLVER.AMP.ENABLED", "True", "SOLVER.AMP.PRECISION", "bfloat16"]
    trainer = Trainer(tiny_cfg(str(tmp_path), *opts))
    assert trainer.plan.batch.accumulation == 2
    record = RecordWeights()
    trainer.register_hooks([record])
    trainer.resume_or_load(resume=False)
    trainer.train()
    assert trainer.ema.updates == 5 and len(record.seen) == 6
    for name in ("conv1.weight", "head.bias", "norm2.running_mean"):
        expected = closed_form([w[name] for w in record.seen], 0.64)
        torch.testing.assert_close(trainer.ema.weights[name].double(), expected, rtol=1e-5, atol=1e-6)
    # the average is not the trained weights
    assert not torch.equal(trainer.ema.weights["head.bias"], record.seen[-1]["head.bias"])


def test_resume_restores_the_average_bit_exactly(tiny_shapes, tmp_path):
    opts = [*EMA_OPTS, "SOLVER.MAX_ITER", "6", "SOLVER.CHECKPOINT_PERIOD", "3", "RESEED_EVERY_ITER", "True"]
    seed_all_rng(0)  # the same initial weights in both runs
    straight = Trainer(tiny_cfg(str(tmp_path / "straight"), *opts))
    straight.resume_or_load(resume=False)
    straight.train()

    out = tmp_path / "killed"
    seed_all_rng(0)
    first = Trainer(tiny_cfg(str(out), *opts))
    first.register_hooks([StopAt(3)])
    first.resume_or_load(resume=False)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    saved = torch.load(out / "model_0000002.pth", weights_only=False)
    assert saved["model_ema"]["updates"] == 3

    seed_all_rng(1)  # a different process state: everything must come from the checkpoint
    resumed = Trainer(tiny_cfg(str(out), *opts))
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 3 and resumed.ema.updates == 3
    resumed.train()
    reference, final = weights(straight.model), weights(resumed.model)
    assert [k for k in reference if not torch.equal(final[k], reference[k])] == []
    reference = straight.ema.weights
    assert [k for k, v in resumed.ema.weights.items() if not torch.equal(v, reference[k])] == []
    assert not torch.equal(reference["head.bias"], final["head.bias"])
    assert resumed.ema.updates == 6


def test_eval_only_tests_the_checkpoints_average(tiny_shapes, tmp_path):
    cfg = tiny_cfg(str(tmp_path), *EMA_OPTS, "SOLVER.MAX_ITER", "3")
    trainer = Trainer(cfg)
    trainer.resume_or_load(resume=False)
    trainer.train()
    averaged = float(trainer.ema.weights["head.bias"].sum())
    trained = float(weights(trainer.model)["head.bias"].sum())
    assert averaged != trained

    class Probe(Trainer):
        @classmethod
        def test(cls, cfg, model, evaluators=None):
            return {"head_bias": float(model.head.bias.sum())}

    args = argparse.Namespace(eval_only=True, resume=False)
    final = str(tmp_path / "model_final.pth")
    for mode, expected in (("ema", {"head_bias": averaged}), ("model", {"head_bias": trained}),
                           ("both", {"head_bias": averaged, "model/head_bias": trained})):  # fmt: skip
        cfg_eval = tiny_cfg(str(tmp_path), *EMA_OPTS, "MODEL.WEIGHTS", final, "MODEL_EMA.EVAL", mode)
        results = train_or_evaluate(Probe, cfg_eval, args)
        assert results.keys() == expected.keys()
        for key, value in expected.items():
            assert results[key] == pytest.approx(value, rel=1e-6)


def _two_process_ema(spec, output_dir, result_file):
    from detectron2.utils import comm

    from largedet.data import register_shapes
    from largedet.launch.processes import shut_down_distributed

    register_shapes(spec, prefix="tiny_shapes")
    seed_all_rng(0)
    trainer = Trainer(tiny_cfg(output_dir, *EMA_OPTS, "SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 2,
                               "SOLVER.MAX_ITER", 3))  # fmt: skip
    record = RecordWeights()
    trainer.register_hooks([record])
    trainer.train()
    averages = comm.all_gather({k: v.clone() for k, v in trainer.ema.weights.items()})
    if comm.is_main_process():
        torch.save({"averages": averages, "seen": record.seen}, result_file)
    comm.synchronize()
    shut_down_distributed()


def test_under_ddp_every_rank_holds_the_same_average(tiny_shapes, tmp_path):
    from engine_testing import run_on_two_processes

    result = run_on_two_processes(_two_process_ema, tiny_shapes, tmp_path)
    first, second = result["averages"]
    assert [k for k in first if "running" not in k and not torch.equal(first[k], second[k])] == []
    # batch 8 = 2 processes x 2 images x K 2: per-step decay 0.8 ** (8 / 2)
    expected = closed_form([w["head.weight"] for w in result["seen"]], 0.8**4)
    torch.testing.assert_close(first["head.weight"].double(), expected, rtol=1e-5, atol=1e-6)
