"""check's file watcher (reprocube.check.file_activity) where what it watches changes under it: it
must never stop seeing and still say it saw everything (a save it missed reads as no save: a correct
resume called state-leaked, seen on an H200 on 2026-11-27), and never print a traceback."""

from __future__ import annotations

import os
import time

import pytest

from reprocube.check import file_activity
from reprocube.check.file_activity import FileActivity


def wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_a_file_gone_between_a_new_directorys_listing_and_its_size_is_a_write_of_no_size(tmp_path, monkeypatch):
    """The race seen: a temporary directory made and emptied at once (a library's probe-source)."""
    (tmp_path / "work").mkdir()
    made = tmp_path / "work" / "tmpdir"
    made.mkdir()
    (made / "gone").write_bytes(b"x")
    listed = list(os.scandir(made))
    (made / "gone").unlink()

    class Listing:
        def __enter__(self):
            return iter(listed)

        def __exit__(self, *exc):
            return False

    activity = FileActivity({"work": tmp_path / "work"})
    activity._fd = file_activity._libc.inotify_init1(file_activity.IN_NONBLOCK | file_activity.IN_CLOEXEC)
    try:
        monkeypatch.setattr(file_activity.os, "scandir", lambda directory: Listing())
        monkeypatch.setattr(file_activity.Path, "exists", lambda path: True)  # there when asked, gone after
        activity._watch_tree(made, "work/tmpdir", new=True)
    finally:
        os.close(activity._fd)
    assert [(e.path, e.size) for e in activity.events] == [("work/tmpdir/gone", None)]
    assert activity.complete


def test_a_watcher_that_fails_on_an_event_says_it_did_not_see_everything(tmp_path, monkeypatch, capfd):
    def failing(self, wd, mask, name, now):
        raise FileNotFoundError(2, "No such file or directory", name)

    monkeypatch.setattr(FileActivity, "_event", failing)
    with FileActivity({"work": tmp_path}) as activity:
        (tmp_path / "checkpoint.pt").write_bytes(b"state")
        assert wait_for(lambda: not activity.complete)
        (tmp_path / "later.pt").write_bytes(b"state")  # the watcher goes on reading after the failure
        time.sleep(0.1)
        assert activity._thread.is_alive()
    assert activity.why_incomplete == "the watcher failed on an event (FileNotFoundError)"
    assert activity.state_keys() == frozenset()  # nothing concluded from what it saw
    assert "Traceback" not in capfd.readouterr().err


def test_a_restarts_read_and_its_next_save_read_from_one_batch_keep_their_order(tmp_path):
    """On a busy machine the watcher reads a restart's read of its checkpoint and its next save of it in one
    batch, stamped with one time: the read came first, so the restart read what was saved before the stop
    (test_stops_and_resume_findings's F21 was not-resumed, 'read none of the 1 file saved', 1 run in 4 under load)."""
    from reprocube.check.file_activity import Event
    from reprocube.check.stop_evidence import _restart_reads

    activity = FileActivity({"work": tmp_path})
    activity.events = [Event(10.0, "read", "work/ckpt.pkl"), Event(10.0, "write", "work/ckpt.pkl", 64)]
    assert [e.kind for e in _restart_reads(activity, {"work/ckpt.pkl"}, 9.0, 20.0)] == ["read"]
    # A read after the restart wrote the file again is of its own save, never of the one before the stop.
    activity.events.reverse()
    assert _restart_reads(activity, {"work/ckpt.pkl"}, 9.0, 20.0) == []


@pytest.mark.process
def test_whether_a_process_group_catches_a_signal_is_read_from_proc():
    """What decides whether a stop's save may have come after its signal (round 7's F17): a group whose
    processes do not catch SIGTERM die of it at once."""
    import signal
    import subprocess
    import sys

    from reprocube.check.runs import _group_catches

    for handler, expected in (("signal.SIG_DFL", False), ("lambda *a: None", True)):
        code = (
            f"import signal, sys, time; signal.signal(signal.SIGTERM, {handler}); print(1, flush=True); time.sleep(30)"
        )
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
        try:
            child.stdout.readline()
            assert _group_catches(child.pid, signal.SIGTERM) is expected, handler
            assert _group_catches(child.pid, signal.SIGUSR2) is False
        finally:
            child.kill()
            child.wait()


def _written(tmp_path, writes: list[tuple[float, str]]) -> FileActivity:
    from reprocube.check.file_activity import Event

    activity = FileActivity({"work": tmp_path})
    activity.events = [Event(at, "write", path, 64) for at, path in writes]
    return activity


HF_FILES = ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]


@pytest.mark.parametrize(
    "case, writes, saves",
    [
        # The HF Trainer fills checkpoint-N/ file by file (an optimizer of GBs takes seconds): one save each.
        (
            "checkpoint folders",
            [(t + 0.3 * i, f"work/out/checkpoint-{n}/{f}") for n, t in ((5, 10.0), (10, 20.0)) for i, f in enumerate(HF_FILES)],
            [(10.0, 11.2, 5), (20.0, 21.2, 5)],
        ),
        # Lightning's epoch=...ckpt, then last.ckpt beside it: one save.
        ("a checkpoint and its last copy", [(5.0, "work/ckpt/epoch=0-step=16.ckpt"), (5.4, "work/ckpt/last.ckpt"),
                                            (9.0, "work/ckpt/epoch=1-step=32.ckpt"), (9.4, "work/ckpt/last.ckpt")],
         [(5.0, 5.4, 2), (9.0, 9.4, 2)]),
        # Files at the top: one save within MERGE_S only; two checkpoint slots a second apart are two saves
        # (the adversary's s5: joined, every stop came after slot B, never where slot A was the newest).
        (
            "files at the top",
            [(1.0, "work/model.pt"), (1.01, "work/optim.pt"), (2.0, "work/slot_a.npz"), (3.0, "work/slot_b.npz")],
            [(1.0, 1.01, 2), (2.0, 2.0, 1), (3.0, 3.0, 1)],
        ),
        # The same file again is the next save, however soon; a save ends at a pause of SAVE_BURST_S.
        ("the same file again", [(1.0, "work/c/a.pt"), (1.1, "work/c/a.pt"), (1.2, "work/c/b.pt"), (4.0, "work/c/c.pt")],
         [(1.0, 1.0, 1), (1.1, 1.2, 2), (4.0, 4.0, 1)]),
    ],
)  # fmt: skip
def test_a_save_is_every_file_the_script_wrote_for_it(tmp_path, case, writes, saves):
    """Issue 66 item 1: a save is a burst of writes (a folder's files, a file and its companion), not each
    file: the HF Trainer's 7 files a checkpoint made the time between two saves milliseconds, and every
    default stop fell inside checkpoint-5/."""
    activity = _written(tmp_path, writes)
    found = activity.saves(state=frozenset(file_activity.state_key(p) for _, p in writes))
    assert [(s.start, s.end, len(s.keys)) for s in found] == saves, case
    assert activity.save_moments(state=frozenset(file_activity.state_key(p) for _, p in writes)) == [
        s[0] for s in saves
    ]


def test_a_default_stop_waits_until_the_attempts_first_save_is_whole(tmp_path):
    """The stop's moment counts from the last file of the attempt's first whole save (all the files an
    uninterrupted run's save holds), never from its first file, nor from a partial save (the adversary's s3:
    a status file a restart writes as it starts was taken for its first save, and every stop came before the
    restart's own first checkpoint)."""
    from reprocube.check.file_activity import state_key, whole_save
    from reprocube.check.runs import Run, whole_save_ended

    clean = _written(
        tmp_path,
        [
            (t + 0.3 * i, f"work/out/checkpoint-{n}/{f}")
            for n, t in ((5, 1.0), (10, 3.0))
            for i, f in enumerate(HF_FILES)
        ],
    )
    state = clean.state_keys()
    run = Run("stopped", tmp_path, tmp_path / "log", {}, [], tmp_path / "probe", state=state)
    run.save_keys = whole_save(clean.saves(state=state))
    assert run.save_keys == {state_key(f"work/out/checkpoint-5/{f}") for f in HF_FILES}
    partial = [(20.0 + 0.3 * i, f"work/out/checkpoint-5/{f}") for i, f in enumerate(HF_FILES)]
    run.activity = _written(tmp_path, partial[:3])
    assert whole_save_ended(run, 19.0) is None  # 3 of 5 files: not yet, however long it waits
    run.activity = _written(tmp_path, partial)
    assert whole_save_ended(run, 19.0) == 21.2  # its last file: whole
    later = [(30.0 + 0.3 * i, f"work/out/checkpoint-10/{f}") for i, f in enumerate(HF_FILES)]
    run.activity = _written(tmp_path, [(19.5, "work/out/checkpoint-5/trainer_state.json"), *later])
    assert whole_save_ended(run, 19.0) == 31.2  # a partial save first: the whole one after it
    assert whole_save_ended(run, 19.0, nth=2) is None  # --sweep's stop after a second one: not yet
    run.activity = _written(tmp_path, [*partial, *later])
    assert whole_save_ended(run, 19.0, nth=2) == 31.2


def test_a_save_is_whole_only_with_every_file_of_a_whole_save():
    """One rule for a stop's placement and the swapped restart's copy: every file of a whole save, however
    long the pause after a partial one (a status file a restart writes as it starts is no save)."""
    from reprocube.check.file_activity import Save

    whole = frozenset({"a", "b", "c"})
    assert Save(1.0, 1.2, whole, "work/c").is_whole(whole)
    assert Save(1.0, 1.2, whole | {"d"}, "work/c").is_whole(whole)
    assert not Save(1.0, 1.2, frozenset({"a", "b"}), "work/c").is_whole(whole)


def test_a_new_directory_seen_twice_is_scanned_once(tmp_path):
    """A directory made with its parent (os.makedirs("out/checkpoint-3")) can be both listed in the
    parent's scan and announced by its own IN_CREATE: the second look scanned its files again, each a second
    write, and under load both uninterrupted runs counted 5 saves for 4 folders (the folder test's
    not-resumed in the full suite, 2026-12-07)."""
    activity = FileActivity({"work": tmp_path}).start()
    try:
        folder = tmp_path / "out" / "checkpoint-3"
        folder.mkdir(parents=True)
        (folder / "weights.npy").write_bytes(b"w")
        assert wait_for(lambda: any(e.path == "work/out/checkpoint-3/weights.npy" for e in activity.writes()))
        activity._watch_tree(folder, "work/out/checkpoint-3", new=True)  # the second look
        time.sleep(0.1)
        assert [e.path for e in activity.writes()].count("work/out/checkpoint-3/weights.npy") == 1
    finally:
        activity.stop()


def test_a_temporary_file_renamed_into_place_is_one_save_with_it_across_an_update(tmp_path):
    """Grouped by the run's updates once it ended: a checkpoint written to ckpt.tmp and renamed to ckpt.json.
    The temporary file was gone when the watcher looked (stamped when seen, after the next update began); the
    renamed file keeps the content's time, before that update: one save, not two halves (which the sweep's
    count of whole saves before a stop, and every later save's placement, would have split)."""
    from reprocube.check.file_activity import Event, state_key

    activity = FileActivity({"work": tmp_path})
    activity.events = [
        Event(1.000, "write", "work/ckpt.tmp", None),  # gone when seen: its own time unknown
        Event(1.001, "write", "work/ckpt.json", 64, renamed=True, modified=0.995),
        Event(2.000, "write", "work/ckpt.tmp", None),
        Event(2.001, "write", "work/ckpt.json", 64, renamed=True, modified=1.996),
    ]
    activity.updates = (0.5, 0.998, 1.5, 1.998)  # the next update began between the write and the look
    keys = frozenset(state_key(p) for p in ("work/ckpt.tmp", "work/ckpt.json"))
    assert [sorted(save.keys) for save in activity.saves(state=keys)] == [sorted(keys)] * 2
    in_place = [Event(1.000, "write", "work/a.pt", 64, modified=1.0), Event(1.001, "write", "work/b.pt", 64)]
    activity.events, activity.updates = in_place, (1.0005,)  # no rename: an update between is two saves
    state = frozenset(state_key(p) for p in ("work/a.pt", "work/b.pt"))
    assert len(activity.saves(state=state)) == 2
