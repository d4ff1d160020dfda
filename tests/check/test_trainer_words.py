"""check.trainer_words: a trainer's own known messages, found in the restarts' part of the stopped run's
log only, the log read from its end and never through a link (issue 66 item 4)."""

from __future__ import annotations

import os

from reprocube.check import trainer_words
from reprocube.check.trainer_words import restarts_said

LIGHTNING = (
    "training_epoch_loop.py:224: You're resuming from a checkpoint that ended before the epoch ended and your "
    "dataloader is not resumable. This can cause unreliable results if further training is done."
)


def test_a_known_message_in_a_restart_is_named_and_one_in_the_first_attempt_is_not(tmp_path):
    log = tmp_path / "stopped.log"
    log.write_text(f"$ python fit.py\n{LIGHTNING}\nstep 8 saved\n$ python fit.py\nresumed\n")
    assert restarts_said(log) == ()  # the first attempt's words are no restart's
    log.write_text(f"$ python fit.py\nstep 8 saved\n$ python fit.py\n\x1b[31m{LIGHTNING}\x1b[0m\n$ python fit.py\n")
    (said,) = restarts_said(log)
    assert said.startswith("Lightning warned in the restart") and "lightning-save-rng-mid-epoch" in said
    assert "\x1b" not in said and "training_epoch_loop" not in said  # check's words, never the log's


def test_only_the_logs_end_is_read_and_a_link_is_not_followed(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_words, "MAX_LOG_BYTES", 4096)
    log = tmp_path / "stopped.log"
    log.write_text(f"$ python fit.py\n$ python fit.py\n{LIGHTNING}\n" + "x" * 10_000 + "\n$ python fit.py\nend\n")
    assert restarts_said(log) == ()  # beyond the 4096 bytes read
    log.write_text("$ python fit.py\n" + "x" * 10_000 + f"\n$ python fit.py\n{LIGHTNING}\n")
    assert len(restarts_said(log)) == 1
    os.symlink(log, tmp_path / "link.log")
    assert restarts_said(tmp_path / "link.log") == () and restarts_said(tmp_path / "missing.log") == ()
