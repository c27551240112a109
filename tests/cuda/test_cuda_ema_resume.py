"""The model EMA and a resume after a kill, on CUDA.

Exact resume: the tiny detector (two convs, GroupNorm, a linear head) with PMD-LAMB's
multi-tensor CUDA step, K = 2 micro-batches, AMP bfloat16 and the EMA, under
``torch.use_deterministic_algorithms`` (cuDNN and cuBLAS pick deterministic kernels; cuBLAS
needs ``CUBLAS_WORKSPACE_CONFIG``, set in the conftest before CUDA starts): killed before
step 3, resumed in another process state, the weights, the average and the optimizer state
equal an uninterrupted run's bit for bit.

R50-FPN: its FPN's nearest-neighbour upsampling has no deterministic CUDA backward (atomic
adds), so two straight runs of Faster R-CNN already differ in the last bits; there the test
checks what the resume restores (the weights, the average, the optimizer state and the
iteration equal the checkpoint's, on the GPU) and that training goes on from it.
"""

import os

import pytest
import torch
from engine_testing import StopAt, straight_and_killed, tiny_cfg, weights
from test_cuda_detection_trainer import shrunk_cfg

import largedet  # noqa: F401
from largedet.engine import Trainer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EMA_OPTS = ("MODEL_EMA.ENABLED", "True", "MODEL_EMA.DECAY", "0.8", "MODEL_EMA.REFERENCE_BATCH", "2")


@pytest.fixture
def deterministic():
    saved = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.benchmark = saved[1]


def _same_optimizer_state(a: dict, b: dict) -> list:
    """Keys of the per-parameter state where ``a`` and ``b`` differ (tensors on any device)."""
    differ = []
    for key, state in a["state"].items():
        for name, value in state.items():
            other = b["state"][key][name]
            if not torch.equal(torch.as_tensor(value).cpu(), torch.as_tensor(other).cpu()):
                differ.append((key, name))
    return differ


def test_tiny_detector_resumes_bit_exactly_with_the_ema_on_cuda(tiny_shapes, tmp_path, deterministic):
    def make_cfg(out):
        return tiny_cfg(
            str(out), *EMA_OPTS,
            "MODEL.DEVICE", "cuda", "SOLVER.OPTIMIZER", "PMD_LAMB", "SOLVER.BASE_LR", "0.01",
            "SOLVER.IMS_PER_BATCH", "4", "SOLVER.IMS_PER_DEVICE", "2",
            "SOLVER.MAX_ITER", "6", "SOLVER.CHECKPOINT_PERIOD", "3",
            "SOLVER.AMP.ENABLED", "True", "SOLVER.AMP.PRECISION", "bfloat16",
            "RESEED_EVERY_ITER", "True",
        )  # fmt: skip

    straight, resumed, initial = straight_and_killed(
        make_cfg, tmp_path, stop_at=3, last_checkpoint="model_0000002.pth"
    )
    assert type(straight.optimizer).__name__ == "PMDLAMB"
    assert straight.plan.batch.accumulation == 2
    assert resumed.start_iter == 3 and resumed.ema.updates == 3
    assert next(resumed.model.parameters()).is_cuda
    assert all(v.is_cuda for v in resumed.ema.weights.values())
    resumed.train()

    final, reference = weights(resumed.model), weights(straight.model)
    assert [k for k in reference if not torch.equal(final[k], reference[k])] == []
    assert not torch.equal(initial["head.bias"], reference["head.bias"])
    average = straight.ema.weights
    assert [k for k, v in resumed.ema.weights.items() if not torch.equal(v, average[k])] == []
    assert resumed.ema.updates == 6
    assert not torch.equal(average["head.bias"], reference["head.bias"])
    assert (
        _same_optimizer_state(straight.optimizer.state_dict(), resumed.optimizer.state_dict())
        == []
    )


def test_faster_rcnn_r50_fpn_resume_restores_the_checkpoint_on_cuda(nccl_group, tiny_shapes, tmp_path):
    out = str(tmp_path / "run")

    def make_cfg():
        cfg = shrunk_cfg("r50_fpn_bs1056.yaml", "bfloat16", out)
        cfg.defrost()
        cfg.merge_from_list(
            [*EMA_OPTS, "SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2",
             "RESEED_EVERY_ITER", "True"]
        )  # fmt: skip
        cfg.freeze()
        return cfg

    first = Trainer(make_cfg())
    first.register_hooks([StopAt(3)])
    first.resume_or_load(resume=False)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    checkpoint = os.path.join(out, "model_0000001.pth")
    with open(os.path.join(out, "last_checkpoint")) as f:
        assert f.read() == "model_0000001.pth"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["iteration"] == 1 and saved["model_ema"]["updates"] == 2

    resumed = Trainer(make_cfg())
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 2 and resumed.ema.updates == 2
    model = weights(resumed.model)
    assert all(v.is_cuda for v in model.values())
    assert [k for k, v in saved["model"].items() if not torch.equal(model[k].cpu(), v)] == []
    averaged = {k: v.cpu() for k, v in resumed.ema.weights.items()}
    ema_saved = saved["model_ema"]["weights"]
    assert [k for k, v in ema_saved.items() if not torch.equal(averaged[k], v.cpu())] == []
    assert _same_optimizer_state(saved["trainer"]["_trainer"]["optimizer"], resumed.optimizer.state_dict()) == []

    resumed.train()
    assert resumed.iter == 4 and resumed.ema.updates == 4
    assert all(torch.isfinite(v).all() for v in weights(resumed.model).values())
    assert not torch.equal(weights(resumed.model)["roi_heads.box_predictor.cls_score.bias"].cpu(),
                           saved["model"]["roi_heads.box_predictor.cls_score.bias"])  # fmt: skip

