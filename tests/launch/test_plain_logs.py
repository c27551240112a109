"""log.txt carries no colour codes: Detectron2's default_setup logs the config highlighted for
a terminal; the file handlers of the run's folder drop the escape codes, the console keeps them."""

import io
import logging

from detectron2.utils.logger import setup_logger
from largedet.launch.plain_logs import PlainFormatter, plain_log_files


def test_a_run_folders_log_file_is_plain_and_the_console_keeps_its_colours(tmp_path):
    logger = setup_logger(str(tmp_path), name="largedet_plain_logs_test")
    console = logging.StreamHandler(io.StringIO())
    console.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(console)
    plain_log_files(str(tmp_path))
    plain_log_files(str(tmp_path))  # idempotent: one wrapper
    files = [h for h in logger.handlers if isinstance(h.formatter, PlainFormatter)]
    assert len(files) == 1 and not isinstance(files[0].formatter.inner, PlainFormatter)
    logger.info("config: %s", "\x1b[38;5;186mSOLVER:\x1b[39m")  # as pygments highlights it
    for handler in logger.handlers:
        handler.flush()
    text = (tmp_path / "log.txt").read_text()
    assert "config: SOLVER:" in text and "\x1b[" not in text
    assert "\x1b[" in console.stream.getvalue()
