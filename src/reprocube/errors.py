"""Errors that end a command with one clear line and a documented exit status."""

import sys

# Exit statuses (documented in README.md).
EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_CONFIG = 2
EXIT_DATA = 3
EXIT_CHECKPOINT = 4
EXIT_TRAINING = 5
EXIT_DIFFERENT = 6  # verify / compare: the runs are not bit-identical (a verdict, not an error)
EXIT_LOSSES_ONLY = 7  # reproduce: the trained model is bit-identical, only the reported losses differ
EXIT_NOT_DETERMINISTIC = 8  # check: two uninterrupted runs of the command differ (resume is not blamed)
EXIT_CHECK_VOID = 9  # check: no stop proved anything (the control did not differ, no stop landed, no restart resumed)
EXIT_COMMAND_FAILED = 10  # check: the command failed (exit status, watchdog, or none of its outputs)
EXIT_NOT_PROVEN = 11  # check: every compared output the same, but the resume is not proven (named)
EXIT_STATE_LEAKED = 12  # check: a run began from, or wrote, state outside its own directories
EXIT_SAVE_INTERRUPTED = 13  # check: a stop during a checkpoint's write left a run whose restart failed
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by a signal after writing a checkpoint; resume=latest continues.
EXIT_OUTPUT_LOST = 120  # done, but stdout could not be written (its reader went away): Python's own status


class ReprocubeError(Exception):
    """An expected failure: bad input, missing data, refused checkpoint."""

    exit_code = EXIT_UNEXPECTED


class ConfigError(ReprocubeError):
    exit_code = EXIT_CONFIG


class DataError(ReprocubeError):
    exit_code = EXIT_DATA


class CheckpointError(ReprocubeError):
    exit_code = EXIT_CHECKPOINT
    # False when the checkpoint may be fine but cannot be read here (permissions, a newer format): resume
    # must then stop, not set it aside and continue from an older one.
    damaged = True


class SignatureError(ReprocubeError):
    """A receipt's signature is missing, malformed, by another key, or does not match the receipt."""

    exit_code = EXIT_CHECKPOINT


class TrainingError(ReprocubeError):
    """Training itself failed (e.g. diverged to inf/nan); earlier checkpoints are kept."""

    exit_code = EXIT_TRAINING


def exit_status_of(run) -> int:
    """Run a command; its errors become one `reprocube: error:` line and their exit status."""
    try:
        return run()
    except ReprocubeError as exc:
        print(f"reprocube: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # disk full, permissions, ...: one line, not a traceback
        print(f"reprocube: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_UNEXPECTED
    except KeyboardInterrupt:
        print("reprocube: interrupted", file=sys.stderr)
        return 130
