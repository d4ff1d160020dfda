"""reprocube.runtime.stderr_filter drops exactly the lines it is given from what C code and Python write to fd 2,
passes everything else on in order (a last line without its newline included), and leaves fd 2 as it was;
TensorFlow's start-up chatter is exactly such lines (reprocube.runtime.tensorflow_import, which also keeps
TensorFlow's import from importing JAX). Each case runs in a fresh process, its stderr captured by the
test."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from reprocube.runtime.tensorflow_import import START_UP_CHATTER

pytestmark = pytest.mark.process  # every test here starts a process: not in make test-quick


def stderr_of(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_matching_lines_are_dropped_and_everything_else_passes_in_order():
    stderr = stderr_of(
        r"""
        import os, sys
        from reprocube.runtime.stderr_filter import lines_dropped
        print("before", file=sys.stderr)
        with lines_dropped((r"noise \d+\n", r"WARNING: chatter\n")):
            os.write(2, b"noise 1\nkept from C\nnoise 22\n")
            print("kept from Python", file=sys.stderr)
            os.write(2, b"WARNING: chatter\nnoise 3 is not a whole match\nWARNING: chatter")
        print("after", file=sys.stderr)
        """
    )
    # the last line has no newline, so it is not the dropped line "WARNING: chatter\n": it passes
    assert stderr == "before\nkept from C\nkept from Python\nnoise 3 is not a whole match\nWARNING: chatterafter\n"


def test_fd_2_is_restored_and_the_filter_process_is_gone_after_the_block():
    stderr = stderr_of(
        r"""
        import os
        from reprocube.runtime.stderr_filter import lines_dropped
        before = os.fstat(2)
        with lines_dropped((r"x\n",)):
            os.write(2, b"x\n")
        after = os.fstat(2)
        assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
        def parent_of(pid):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    return stat.read().rsplit(") ", 1)[1].split()[1]
            except FileNotFoundError:  # a process that ended meanwhile
                return None
        children = [pid for pid in os.listdir("/proc") if pid.isdigit() and parent_of(pid) == str(os.getpid())]
        assert children == [], children
        os.write(2, b"x\n")
        """
    )
    assert stderr == "x\n"


def test_tensorflow_prints_exactly_the_chatter_and_reprocube_imports_it_quietly():
    """If a TensorFlow release changes its start-up lines, the first assertion names them."""
    env = "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'; os.environ['TF_ENABLE_ONEDNN_OPTS'] = '1'\n"
    plain = stderr_of(env + "import keras, tensorflow")
    chatter = re.compile("|".join(START_UP_CHATTER))
    assert plain and [line for line in plain.splitlines(keepends=True) if not chatter.fullmatch(line)] == []
    assert stderr_of("import reprocube.runtime.tensorflow_import") == ""


@pytest.mark.parametrize(
    "shell",
    [
        'exec "$0" -c "import os; os.close(2); $1"',  # fd 2 closed after start-up: nothing to duplicate
        'exec "$0" -c "$1" 2>&-',  # started without it: no sys.stderr, and fd 2 may become any file opened
    ],
    ids=["closed-later", "started-without"],
)
def test_without_a_stderr_the_block_runs_unfiltered(shell):
    code = (
        "from reprocube.runtime.stderr_filter import lines_dropped\nwith lines_dropped((r'x\\n',)):\n    print('ran')\n"
    )
    done = subprocess.run(["sh", "-c", shell, sys.executable, code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ran\n")


def test_a_stop_signal_to_every_process_leaves_the_filter_running():
    """SLURM's scancel or preemption signals every process of a step: the parent handles it (reprocube's
    StopRequest); the filter must not die and leave the parent writing into a closed pipe."""
    stderr = stderr_of(
        r"""
        import os, signal, time
        from reprocube.runtime.stderr_filter import lines_dropped
        os.setpgid(0, 0)  # a group of our own, the filter in it
        got = []
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
            signal.signal(signum, lambda s, f: got.append(s))
        with lines_dropped((r"x\n",)):
            time.sleep(0.5)  # the filter is up and has set its signals
            for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
                os.killpg(0, signum)
            time.sleep(0.2)
            os.write(2, b"x\nE0000 a real error after the signals\n")
        assert len(got) == 3, got
        """
    )
    assert stderr == "E0000 a real error after the signals\n"


def test_tensorflows_import_does_not_import_jax_and_jax_imports_after_it():
    """TensorFlow's import would import JAX (tensorflow/lite/python/util.py): 0.4-0.5 s of every TensorFlow
    process. reprocube.runtime.tensorflow_import hides it for that import only."""
    stderr_of(
        """
        import sys
        from reprocube.runtime.tensorflow_import import tf
        assert "jax" not in sys.modules and "jaxlib" not in sys.modules, "TensorFlow's import imported JAX"
        import jax.numpy as jnp
        assert float(jnp.ones(2).sum()) == 2.0 and float(tf.constant(1.0) + 1) == 2.0
        """
    )


def test_tensorflows_import_still_imports_jax_without_the_guard():
    """The guard (reprocube.runtime.tensorflow_import's _jax_not_found) is needed only while TensorFlow's import
    imports JAX (tensorflow/lite/python/util.py's `from jax import jit`). Here is the trainer's import
    without it: when this fails, TensorFlow no longer imports JAX and the guard can be removed (with this
    test and the one above)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import os, sys
                os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # as reprocube.runtime.tensorflow_import
                os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
                import keras
                import tensorflow as tf
                print("jax" in sys.modules)
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True\n", (
        "TensorFlow's import (import keras, import tensorflow, as reprocube.runtime.tensorflow_import) no longer "
        "imports JAX: the guard that hides JAX from it (_jax_not_found) can be removed"
    )
