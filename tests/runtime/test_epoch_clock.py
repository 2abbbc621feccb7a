"""The engine's clock of epoch arrivals (runtime/metrics.py), against a dict of what was noted."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcep.runtime.metrics import EpochClock


@settings(max_examples=100, deadline=None)
@given(gaps=st.lists(st.integers(1, 3), min_size=0, max_size=60), keep=st.sampled_from([4, 16, 1 << 16]))
def test_arrival_of_an_epoch_is_when_it_was_noted_while_kept(gaps, keep):
    """Epochs are noted in increasing order, some skipped (aborted ones); the oldest are dropped
    past ``keep``."""
    clock, noted, epoch = EpochClock(keep=keep), {}, 0
    for gap in gaps:
        epoch += gap
        clock.note(epoch, epoch * 10, epoch * 1000)
        noted[epoch] = epoch * 1000
    kept = set(clock.epochs[:clock.n].tolist())
    for e in range(epoch + 3):
        assert clock.arrival_of(e) == (noted[e] if e in kept else None)
    assert kept >= set(sorted(noted)[-min(len(noted), keep // 2):])
