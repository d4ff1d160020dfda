"""The training loop hands steps to a trainer in groups: each group must end exactly where the loop has
something to do (a loss record, a mid-epoch checkpoint, the preemption drill, the epoch's end), and no
group may be longer than STEPS_PER_CALL (how long a signal can wait). Whether grouping changes the
result is tested end to end in test_training.py (resumes start groups at other steps)."""

from __future__ import annotations

import pytest

from reprocube.training.backend import STEPS_PER_CALL
from reprocube.training.loop import Schedule
from reprocube.training.state import Position

STEPS = 1875  # 60000 examples, batch 32


def at(step: int, global_step: int) -> Position:
    return Position(epoch=global_step // STEPS, step_in_epoch=step, global_step=global_step)


@pytest.mark.parametrize(
    "step, global_step, settings, end",
    [
        (0, 0, {}, 100),  # the next loss record
        (37, 37, {}, 100),  # a resumed run's first group ends on the same record as the original's
        (1850, 1850, {}, 1875),  # the epoch's end
        (25, 1900, {}, 125),  # epoch 2: records are counted in global steps (global 2000 = step 125)
        (0, 0, {"log_every_steps": 0}, STEPS_PER_CALL),  # nothing to do: the longest group
        (0, 0, {"checkpoint_every_steps": 30}, 30),  # a mid-epoch checkpoint
        (200, 200, {"preempt_at_step": 250}, 250),  # the preemption drill lands on its step
        (300, 300, {"preempt_at_step": 250}, 400),  # ... and only once
        (3, 3, {"log_every_steps": 5, "checkpoint_every_steps": 4}, 4),  # the nearest of several
    ],
)
def test_a_group_of_steps_ends_where_the_loop_must_act(step, global_step, settings, end):
    schedule = Schedule(STEPS, epochs=4, **{"log_every_steps": 100, **settings})
    assert schedule.group_end(at(step, global_step)) == end


def test_groups_walk_a_whole_epoch_without_gaps_or_overlaps():
    schedule, position, groups = Schedule(21, epochs=1, log_every_steps=7), Position(), []  # 650 examples
    while position.step_in_epoch < schedule.steps_per_epoch:
        end = schedule.group_end(position)
        groups.append((position.step_in_epoch, end))
        position = Position(0, end, end)
    assert groups == [(0, 7), (7, 14), (14, 21)]


@pytest.mark.parametrize(
    "epochs_done, every_epochs, due",
    [(1, 1, True), (1, 2, False), (2, 2, True), (3, 2, True)],  # epoch 3 of 3: the last is always saved
)
def test_epoch_checkpoints_every_n_epochs_and_the_last(epochs_done, every_epochs, due):
    assert Schedule(21, epochs=3, checkpoint_every_epochs=every_epochs).epoch_checkpoint_due(epochs_done) is due


def test_a_mid_epoch_checkpoint_at_an_epochs_end_gives_way_to_the_epoch_checkpoint():
    schedule = Schedule(20, epochs=3, checkpoint_every_steps=10, checkpoint_every_epochs=2)
    assert schedule.mid_epoch_checkpoint_due(Position(0, 10, 10))
    assert not schedule.mid_epoch_checkpoint_due(Position(0, 15, 15))
    assert schedule.mid_epoch_checkpoint_due(Position(0, 20, 20))  # epoch 1 has no epoch checkpoint (every 2)
    assert not schedule.mid_epoch_checkpoint_due(Position(1, 20, 40))  # epoch 2 has one, with the same state


def test_loss_records_fall_on_multiples_of_log_every_steps():
    assert [s for s in range(1, 12) if Schedule(20, epochs=1, log_every_steps=5).log_due(s)] == [5, 10]
    assert not any(Schedule(20, epochs=1).log_due(s) for s in range(1, 12))
