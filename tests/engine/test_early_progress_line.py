"""A run prints its first progress line (losses and ETA) after its third step, the first one
Detectron2's timer times, whatever LOG_PERIOD is; the file writers keep their period."""

from types import SimpleNamespace

import pytest
from detectron2.utils.events import CommonMetricPrinter, EventWriter

from largedet.engine.writers import EarlyPeriodicWriter


class Printer(CommonMetricPrinter):
    def __init__(self, trainer):
        self.trainer, self.steps = trainer, []

    def write(self):
        self.steps.append(self.trainer.iter)


class FileWriter(EventWriter):
    def __init__(self, trainer):
        self.trainer, self.steps = trainer, []

    def write(self):
        self.steps.append(self.trainer.iter)


def written_steps(start_iter, max_iter, period):
    trainer = SimpleNamespace(iter=start_iter, start_iter=start_iter, max_iter=max_iter)
    printer, file_writer = Printer(trainer), FileWriter(trainer)
    hook = EarlyPeriodicWriter([printer, file_writer], period=period)
    hook.trainer = trainer
    for it in range(start_iter, max_iter):
        trainer.iter = it
        hook.after_step()
    return printer.steps, file_writer.steps


@pytest.mark.parametrize(
    "start_iter, max_iter, period, printed, files",
    [
        (0, 6, 20, [2, 5], [5]),  # a short run: after step 3, then at its end
        (0, 45, 20, [2, 19, 39, 44], [19, 39, 44]),
        (0, 45, 3, [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 44], None),  # period 3: once at step 3
        (10, 45, 20, [12, 19, 39, 44], [19, 39, 44]),  # a resumed run: its own third step
        (0, 3, 20, [2], [2]),  # the third step is the last: one line
    ],
)
def test_the_console_prints_after_the_third_step_and_the_files_keep_their_period(
    start_iter, max_iter, period, printed, files
):
    got_printed, got_files = written_steps(start_iter, max_iter, period)
    assert got_printed == printed
    assert got_files == (printed if files is None else files)
