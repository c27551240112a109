"""The optimizer protocol (largedet.optim.protocol): what PMD-LAMB, LAMB and LARS declare
to the training loop and the solver, the defaults of any other optimizer, and a user's
optimizer that asks for the clock getting it from the loop, as PMD-LAMB does."""

import torch

from largedet.engine import AccumulationTrainer
from largedet.engine.train_loop import StepPlan
from largedet.optim import LAMB, LARS, PMDLAMB, compiled_tensors, group_keys, uses_clock


def _params():
    return [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))]


def test_largedets_optimizers_declare_what_they_need():
    pmd, lamb, lars = PMDLAMB(_params()), LAMB(_params()), LARS(_params())
    assert uses_clock(pmd) and uses_clock(lamb) and not uses_clock(lars)
    assert group_keys(pmd) == group_keys(lamb) == group_keys(lars) == ("adapt",)
    # the compiled step's tensors of a group: none where it is off, all where it is forced
    eager, forced = PMDLAMB(_params(), fused=False), LARS(_params(), fused=True)
    assert compiled_tensors(eager, eager.param_groups[0]) == 0
    assert compiled_tensors(forced, forced.param_groups[0]) == 2


def test_any_other_optimizer_gets_the_defaults():
    sgd = torch.optim.SGD(_params(), lr=0.1)
    assert not uses_clock(sgd) and group_keys(sgd) == ()
    assert compiled_tensors(sgd, sgd.param_groups[0]) is None


class ClockedSGD(torch.optim.SGD):
    """A user's optimizer that asks for the clock."""

    uses_clock = True

    def set_clock(self, clock):
        self.clocks.append(clock)


class NoClockSGD(torch.optim.SGD):
    def set_clock(self, clock):  # not declared: never called
        raise AssertionError("set_clock called on an optimizer that does not use the clock")


def test_the_loop_sets_the_clock_of_an_optimizer_that_declares_it():
    for cls in (ClockedSGD, NoClockSGD):
        model = torch.nn.Linear(2, 1)
        optimizer = cls(model.parameters(), lr=0.1)
        optimizer.clocks = []
        loop = AccumulationTrainer(model, [], optimizer)
        loop.set_step(3, StepPlan(accumulation=1, clock=2.5))
        loop.set_step(4, StepPlan(accumulation=1))  # no batch ramp: no clock
        assert optimizer.clocks == ([2.5] if cls is ClockedSGD else [])
