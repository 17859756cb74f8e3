"""The learning tests' SFT start from a second seed, outside `make test` (`make test-seeds`):
tests/learning_start.py's 900-step SFT of the easy band plus a share of the frontier, from
seed 1, must copy the question's numbers and solve the easy band as the seed-0 start of
tests/test_preference_learning.py does (item 0 of docs/experiment-design.md's "A CI-sized
frontier": at 600 steps seed 1 was mid-transition, which is why SFT runs 900).

It left CI's learning lane because its run (the SFT and its evaluation) was a fifth of the
lane's compute and backs no method's claim: every method trains from seed 0's start
(docs/experiment-design.md, "CI under an hour: one start in the learning lane").
"""

from __future__ import annotations

import pytest
from learning_start import EASY, METHOD_SEED, assert_copies_numbers, train_start

# Alone on an idle 2-core machine the start takes about 10 minutes.
pytestmark = [pytest.mark.learning, pytest.mark.timeout(3600)]

SECOND_SEED = METHOD_SEED + 1


def test_sft_learns_to_copy_numbers_from_a_second_seed(tmp_path):
    # Measured at 900 steps (2026-11-26): copy accuracy 0.998, greedy pass@1 0.985.
    assert_copies_numbers(train_start(SECOND_SEED, tmp_path, (EASY,))["eval"][EASY])
