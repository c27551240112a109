"""A hook for the elastic rejoin test, given to ``tools/train_net.py`` with ``--import
hold_alone`` and ``HOOKS ('HoldWhileAlone',)``: in a round of one process (the survivor
training alone), after its first step it waits until its agent's SIGTERM arrives (the agent
sends it when the lost machine is back), so the round cannot reach the end of the run before
the machine rejoins, however fast or slow the machine. Rounds of more processes never wait."""

import time

from detectron2.engine import HookBase
from detectron2.utils import comm

from largedet.engine import HOOK_REGISTRY


@HOOK_REGISTRY.register()
class HoldWhileAlone(HookBase):
    def __init__(self, cfg):
        self._steps = 0

    def after_step(self):
        self._steps += 1
        if comm.get_world_size() != 1 or self._steps < 2:
            return
        while not self.trainer.loop.stop_requested:
            time.sleep(0.05)
