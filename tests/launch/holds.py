"""Hooks that make the launch tests wait on events rather than on the host's speed, given to
``tools/train_net.py`` with ``--import holds`` (or ``IMPORTS ('holds',)``) and named by
``HOOKS``. Each holds a process after a step until that process is asked to stop (its
pre-emption signal has arrived: ``trainer.loop.stop_requested``; in a run of several
processes, until any of them was); the run then goes on as without the hook: the stop is
agreed in the next step, which saves and exits. A hold that no signal ends fails after
``HOLD_LIMIT_S``.

* ``HoldWhileAlone``: in a round of one process (an elastic job's survivor training alone),
  after that round's second step: the run cannot end before the lost machine is back.
* ``HoldAfterSecondStep``: in a run started from iteration 0, after its second step (with
  ``SOLVER.CHECKPOINT_PERIOD 2``, the step of the first checkpoint): the run cannot end
  before the test's signal arrives. A resumed run never holds.
"""

import time

from detectron2.engine import HookBase
from detectron2.utils import comm

from largedet.engine import HOOK_REGISTRY


#: a held process that no signal reaches fails the test instead of hanging it
HOLD_LIMIT_S = 600


def _until_stop_requested(trainer) -> None:
    """Until this process (one process) or any process of the run (several: they hold at the
    same step and poll together) was asked to stop; RuntimeError after HOLD_LIMIT_S."""
    deadline = time.monotonic() + HOLD_LIMIT_S
    while True:
        state = (bool(trainer.loop.stop_requested), time.monotonic() > deadline)
        states = comm.all_gather(state) if comm.get_world_size() > 1 else [state]
        if any(asked for asked, _ in states):
            return
        if any(late for _, late in states):  # every process gives up together
            raise RuntimeError(f"held {HOLD_LIMIT_S} s after iteration {trainer.iter}: no stop signal came")
        time.sleep(0.05)


@HOOK_REGISTRY.register()
class HoldWhileAlone(HookBase):
    def __init__(self, cfg):
        self._steps = 0

    def after_step(self):
        self._steps += 1
        if comm.get_world_size() == 1 and self._steps == 2:
            _until_stop_requested(self.trainer)


@HOOK_REGISTRY.register()
class HoldAfterSecondStep(HookBase):
    def __init__(self, cfg):
        pass

    def after_step(self):
        if self.trainer.start_iter == 0 and self.trainer.iter == 1:
            _until_stop_requested(self.trainer)
