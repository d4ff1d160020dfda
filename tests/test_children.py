"""The one child launcher: its log file and the rule that names what a failed child said."""

from __future__ import annotations

import sys

from reprocube.commands.children import last_error_line, run_child


def test_a_child_runs_into_its_log_after_a_command_line(tmp_path):
    log = tmp_path / "logs" / "child.log"
    echoed = []
    status = run_child([sys.executable, "-c", "print('out'); import sys; sys.exit(3)"], log, echo=echoed.append)
    assert status == 3 and echoed == ["out"]
    first, second = log.read_text().splitlines()
    assert first.startswith("$ ") and sys.executable in first and second == "out"


def test_the_error_line_is_the_last_attempts_own_line_else_its_traceback(tmp_path):
    log = tmp_path / "child.log"
    log.write_text(
        "$ try 1\nreprocube: error: an old failure\n$ try 2\nI0000 tf start-up\nTraceback (most recent call last):\nValueError: the new one\n"
    )
    assert last_error_line(log) == "ValueError: the new one"
    log.write_text("$ try 1\nI0000 start-up line\nreprocube: error: bad config\nI0000 a later line\n")
    assert last_error_line(log) == "reprocube: error: bad config"
    log.write_text("$ try 1\n")
    assert last_error_line(log) == "no output"
    assert last_error_line(tmp_path / "absent.log").startswith("no log at")
