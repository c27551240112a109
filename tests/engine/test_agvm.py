"""AGVM in the trainer: the two micro-batch halves, the LR the optimizer uses, bit-identity
when it cannot move, every optimizer from the config, logging, the K = 1 error, resume."""

import math

import pytest
import torch
from engine_testing import StopAt, synthetic_batch, tiny_cfg, weights

import largedet  # noqa: F401
from detectron2.engine import HookBase
from detectron2.modeling import build_model
from detectron2.utils.env import seed_all_rng
from detectron2.utils.events import EventStorage
from largedet.engine import AccumulationTrainer, Trainer
from largedet.solver import build_agvm, build_optimizer

# LargeDetTinyDetector's parts: the two convs and their norms, and the linear head
AGVM_OPTS = [
    "SOLVER.AGVM.ENABLED", True,
    "SOLVER.AGVM.GROUPS", (("backbone", "conv"), ("backbone", "norm"), ("head", "head")),
    "SOLVER.AGVM.PERIOD", 1, "SOLVER.AGVM.START_ITER", 0,
]  # fmt: skip


def capture_estimates(agvm):
    """Record the (param, g_A, g_B) triples and the phi of each AGVM update."""
    calls = []
    update = agvm.update

    def recording_update(estimates):
        phi = update(estimates)
        calls.append(([(p, a.clone(), b.clone()) for p, a, b in estimates], dict(phi)))
        return phi

    agvm.update = recording_update
    return calls


def grads_of(model, micro_batches, k):
    """The gradient of sum(loss(micro) / k) over ``micro_batches``."""
    model.zero_grad()
    for batch in micro_batches:
        (sum(model(batch).values()) / k).backward()
    return {p: p.grad.detach().clone() for p in model.parameters()}


def test_the_two_estimates_are_the_first_and_second_halves_of_the_micro_batches():
    cfg = tiny_cfg("", *AGVM_OPTS)
    data = synthetic_batch(8, seed=4)
    micro = [data[0:2], data[2:4], data[4:6], data[6:8]]
    torch.manual_seed(0)
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)
    agvm = build_agvm(cfg, optimizer)
    calls = capture_estimates(agvm)
    trainer = AccumulationTrainer(model, micro, optimizer, 4, agvm=agvm)
    with EventStorage(0) as trainer.storage:
        trainer.run_step()

    torch.manual_seed(0)
    reference = build_model(cfg)  # the same initial weights
    names = dict(zip(reference.parameters(), (n for n, _ in reference.named_parameters())))
    first = grads_of(reference, micro[:2], 4)
    second = grads_of(reference, micro[2:], 4)
    first = {names[p]: g for p, g in first.items()}
    second = {names[p]: g for p, g in second.items()}
    ((estimates, phi),) = calls
    by_name = {n: p for n, p in model.named_parameters()}
    assert len(estimates) == len(by_name)
    for p, g_a, g_b in estimates:
        name = next(n for n, q in by_name.items() if q is p)
        torch.testing.assert_close(g_a, first[name], rtol=0, atol=1e-6, msg=name)
        torch.testing.assert_close(g_b, second[name], rtol=0, atol=1e-6, msg=name)
    # phi per part from the separately computed halves, in float64
    for part, prefixes in (("backbone", ("conv", "norm")), ("head", ("head",))):
        a = torch.cat([first[n].double().flatten() for n in first if n.startswith(prefixes)])
        b = torch.cat([second[n].double().flatten() for n in second if n.startswith(prefixes)])
        assert phi[part] == pytest.approx(1 - float(a @ b / (a.norm() * b.norm())), abs=1e-6)


class RecordUsedLR(HookBase):
    """The scheduler's LR of every group before each step, and the LRs and mu the optimizer
    sees inside ``optimizer.step``."""

    def __init__(self):
        self.scheduled, self.used, self.mu = [], [], []

    def before_train(self):
        optimizer = self.trainer.optimizer
        step = optimizer.step

        def recording_step(*args, **kwargs):
            self.used.append([g["lr"] for g in optimizer.param_groups])
            self.mu.append([self.trainer.loop.agvm.mu[g["agvm_part"]] for g in optimizer.param_groups])
            return step(*args, **kwargs)

        optimizer.step = recording_step

    def before_step(self):
        self.scheduled.append([g["lr"] for g in self.trainer.optimizer.param_groups])


def test_the_optimizer_uses_the_schedulers_lr_times_mu(tiny_shapes, tmp_path):
    cfg = tiny_cfg(
        str(tmp_path), *AGVM_OPTS,
        "SOLVER.IMS_PER_BATCH", 8, "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 5,
        "SOLVER.LSR.ENABLED", True, "SOLVER.LSR.REFERENCE_BATCH", 2, "SOLVER.LSR.REFERENCE_LR", 0.01,
        "SOLVER.WARMUP_ITERS", 2, "SOLVER.WARMUP_FACTOR", 0.5, "SOLVER.STEPS", (4,),
        "SOLVER.AGVM.MOMENTUM", 0.0,
    )  # fmt: skip
    trainer = Trainer(cfg)
    record = RecordUsedLR()
    trainer.register_hooks([record])
    trainer.train()
    # the schedule is untouched: peak 0.04, warmup 0.5 then 0.75 of it, x0.1 from iteration 4
    expected = [0.02, 0.03, 0.04, 0.04, 0.004]
    for lrs, lr in zip(record.scheduled, expected):
        assert lrs == pytest.approx([lr] * len(lrs), rel=1e-12)
    assert len(record.used) == 5
    for scheduled, used, mu in zip(record.scheduled, record.used, record.mu):
        assert used == pytest.approx([s * m for s, m in zip(scheduled, mu)], rel=1e-15)
    head_mu = [
        m
        for step in record.mu
        for m, g in zip(step, trainer.optimizer.param_groups)
        if g["agvm_part"] == "head"
    ]
    assert any(abs(m - 1) > 1e-3 for m in head_mu)  # mu moved, so the test can fail
    assert all(
        m == 1.0
        for step in record.mu
        for m, g in zip(step, trainer.optimizer.param_groups)
        if g["agvm_part"] == "backbone"
    )


@pytest.mark.parametrize("foreach", [True, False])
def test_agvm_that_cannot_move_is_bit_identical_to_no_agvm(tiny_shapes, tmp_path, foreach):
    # CLAMP (1, 1): mu stays exactly 1, so the estimate (snapshot, halves) must not change a bit
    opts = ["SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 3, "SOLVER.FOREACH", foreach]
    results = {}
    for name, extra in (("off", []), ("on", AGVM_OPTS + ["SOLVER.AGVM.CLAMP", (1.0, 1.0)])):
        seed_all_rng(0)
        trainer = Trainer(tiny_cfg(str(tmp_path / name), *opts, *extra))
        trainer.train()
        results[name] = weights(trainer.model)
    assert [k for k in results["off"] if not torch.equal(results["off"][k], results["on"][k])] == []
    seed_all_rng(0)
    initial = weights(Trainer.build_model(tiny_cfg(str(tmp_path))))
    assert any(not torch.equal(initial[k], results["on"][k]) for k in initial)


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW", "LAMB", "PMD_LAMB", "LARS"])
def test_every_optimizer_trains_with_agvm_from_the_config_and_logs_phi_and_mu(
    tiny_shapes, tmp_path, optimizer
):
    cfg = tiny_cfg(
        str(tmp_path), *AGVM_OPTS, "SOLVER.OPTIMIZER", optimizer, "SOLVER.BASE_LR", 0.01,
        "SOLVER.IMS_PER_DEVICE", 2, "SOLVER.MAX_ITER", 2, "SOLVER.AGVM.MOMENTUM", 0.5,
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer.train()
    assert trainer.loop.agvm.num_estimates == 2
    history = trainer.storage.histories()
    for part in ("backbone", "head"):
        phis = [v for v, _ in history[f"agvm/phi/{part}"].values()]
        mus = [v for v, _ in history[f"agvm/mu/{part}"].values()]
        assert len(phis) == len(mus) == 2
        assert all(0 <= v <= 2 for v in phis) and all(math.isfinite(v) for v in mus)
    assert [v for v, _ in history["agvm/mu/backbone"].values()] == [1.0, 1.0]
    assert trainer.loop.agvm.mu["head"] != 1.0
    assert all(torch.isfinite(v).all() for v in weights(trainer.model).values())


def test_one_micro_batch_on_one_process_is_an_error_naming_the_keys(tiny_shapes, tmp_path):
    with pytest.raises(
        ValueError, match=r"SOLVER.AGVM.ENABLED.*K = 1 on one process.*SOLVER.IMS_PER_DEVICE"
    ):
        Trainer(tiny_cfg(str(tmp_path), *AGVM_OPTS))  # IMS_PER_DEVICE 0: K = 1


def test_resume_restores_mu_and_reaches_the_same_weights(tiny_shapes, tmp_path):
    opts = AGVM_OPTS + [
        "SOLVER.OPTIMIZER", "AdamW", "SOLVER.BASE_LR", 0.01, "SOLVER.IMS_PER_DEVICE", 2,
        "SOLVER.MAX_ITER", 5, "SOLVER.CHECKPOINT_PERIOD", 2, "SOLVER.AGVM.MOMENTUM", 0.5,
        "SOLVER.AGVM.PERIOD", 2, "RESEED_EVERY_ITER", True,
    ]  # fmt: skip
    seed_all_rng(0)
    straight = Trainer(tiny_cfg(str(tmp_path / "straight"), *opts))
    straight.train()

    out = tmp_path / "killed"
    seed_all_rng(0)
    first = Trainer(tiny_cfg(str(out), *opts))
    first.register_hooks([StopAt(4)])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    saved = torch.load(out / "model_0000003.pth", weights_only=False)["trainer"]["_trainer"]["agvm"]
    assert saved["num_estimates"] == 2 and saved["mu"]["head"] != 1.0  # iterations 0 and 2

    seed_all_rng(1)
    resumed = Trainer(tiny_cfg(str(out), *opts))
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 4 and resumed.loop.agvm.mu == saved["mu"]
    resumed.train()
    assert resumed.loop.agvm.state_dict() == straight.loop.agvm.state_dict()
    final, reference = weights(resumed.model), weights(straight.model)
    assert [k for k in reference if not torch.equal(final[k], reference[k])] == []


def test_float16_estimates_are_unscaled_like_the_gradient():
    # with a gradient scale of 2^10 the first half's copy is scaled, the summed gradient is
    # unscaled before AGVM: phi must match full precision's
    data = synthetic_batch(8, seed=4)
    micro = [data[0:2], data[2:4], data[4:6], data[6:8]]
    phi = {}
    for amp in (None, torch.float16):
        cfg = tiny_cfg("", *AGVM_OPTS)
        torch.manual_seed(0)
        model = build_model(cfg)
        optimizer = build_optimizer(cfg, model)
        agvm = build_agvm(cfg, optimizer)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if amp else None
        trainer = AccumulationTrainer(
            model, micro, optimizer, 4, agvm=agvm, amp_dtype=amp, grad_scaler=scaler
        )
        with EventStorage(0) as trainer.storage:
            trainer.run_step()
        phi[amp] = agvm.phi
    for part, value in phi[None].items():
        assert phi[torch.float16][part] == pytest.approx(value, abs=5e-3)
