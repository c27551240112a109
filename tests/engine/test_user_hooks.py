"""A user's hook registered on largedet's Trainer: every ``HookBase`` method runs, in
Detectron2's order, ``after_backward`` included (the inner accumulation trainer runs the
backward passes and hands ``after_backward`` to the Trainer's hooks, once per optimizer step
after all K micro-batches)."""

from detectron2.engine import HookBase
from engine_testing import tiny_cfg

from largedet.engine import Trainer


class Recorder(HookBase):
    def __init__(self):
        self.calls = []

    def before_train(self):
        self.calls.append(("before_train", self.trainer.iter))

    def before_step(self):
        self.calls.append(("before_step", self.trainer.iter))

    def after_backward(self):
        # the gradients of the whole step are there: the K micro-batches were all summed
        grads = [p.grad for p in self.trainer.model.parameters() if p.grad is not None]
        self.calls.append(("after_backward", self.trainer.iter, len(grads) > 0))

    def after_step(self):
        self.calls.append(("after_step", self.trainer.iter))

    def after_train(self):
        self.calls.append(("after_train", self.trainer.iter))


def test_every_hook_method_of_a_users_hook_runs(tiny_shapes, tmp_path):
    # 3 optimizer steps of 4 images, each accumulated over K = 2 passes of 2 images
    cfg = tiny_cfg(str(tmp_path), "SOLVER.MAX_ITER", "3", "SOLVER.IMS_PER_DEVICE", "2")
    trainer = Trainer(cfg)
    assert trainer.loop.accumulation_steps == 2
    hook = Recorder()
    trainer.register_hooks([hook])
    trainer.resume_or_load(resume=False)
    trainer.train()
    steps = [[("before_step", i), ("after_backward", i, True), ("after_step", i)] for i in range(3)]
    assert hook.calls == [("before_train", 0), *sum(steps, []), ("after_train", 3)]
