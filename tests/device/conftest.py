"""Shared fixture of the scheduler-logic tests: host-built schedulers that are always closed."""
import pytest

from tests.device.harness import Config, HostScheduler


@pytest.fixture
def make():
    made = []

    def factory(**kw):
        h = HostScheduler(Config(**kw))
        made.append(h)
        return h

    yield factory
    for h in made:
        h.close()
