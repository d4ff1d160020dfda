"""The training loop hands steps to a trainer in groups: each group must end exactly where the loop has
something to do (a loss record, a mid-epoch checkpoint, the preemption drill, the epoch's end), and no
group may be longer than STEPS_PER_CALL (how long a signal can wait). Whether grouping changes the
result is tested end to end in test_training.py (resumes start groups at other steps)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from reprocube.backend import STEPS_PER_CALL
from reprocube.data.sampler import EpochSampler
from reprocube.loop import Position, _Trainer


def trainer_at(step: int, global_step: int, log: int = 100, every_steps: int = 0, preempt: int | None = None, examples: int = 60000) -> _Trainer:
    trainer = _Trainer.__new__(_Trainer)  # the grouping needs only the config, the sampler and the position
    trainer.cfg = OmegaConf.create({"log": {"every_steps": log}, "checkpoint": {"every_steps": every_steps}, "preempt_at_step": preempt})
    trainer.sampler = EpochSampler(0, examples, 32)  # 1875 steps per epoch
    trainer.position = Position(epoch=global_step // 1875, step=step, global_step=global_step)
    return trainer


@pytest.mark.parametrize(
    "step, global_step, settings, end",
    [
        (0, 0, {}, 100),  # the next loss record
        (37, 37, {}, 100),  # a resumed run's first group ends on the same record as the original's
        (1850, 1850, {}, 1875),  # the epoch's end
        (25, 1900, {}, 125),  # epoch 2: records are counted in global steps (global 2000 = step 125)
        (0, 0, {"log": 0}, STEPS_PER_CALL),  # nothing to do: the longest group
        (0, 0, {"every_steps": 30}, 30),  # a mid-epoch checkpoint
        (200, 200, {"preempt": 250}, 250),  # the preemption drill lands on its step
        (300, 300, {"preempt": 250}, 400),  # ... and only once
        (3, 3, {"log": 5, "every_steps": 4}, 4),  # the nearest of several
    ],
)
def test_a_group_of_steps_ends_where_the_loop_must_act(step, global_step, settings, end):
    assert trainer_at(step, global_step, **settings)._steps_until_action(step) == end


def test_groups_walk_a_whole_epoch_without_gaps_or_overlaps():
    trainer, step, groups = trainer_at(0, 0, log=7, examples=650), 0, []
    while step < trainer.sampler.steps_per_epoch:
        end = trainer._steps_until_action(step)
        groups.append((step, end))
        trainer.position = Position(0, end, end)
        step = end
    assert groups == [(0, 7), (7, 14), (14, 21)]
