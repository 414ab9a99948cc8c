"""When Horovod starts twice, and at which Gloo timeouts (tfsyncmodes/strategies/horovod_start.py).

The rule, written here apart from the package: an elastic job whose join timeout is above its
collective timeout, with HOROVOD_GLOO_TIMEOUT_SECONDS unset or equal to the collective timeout,
starts at the join timeout and then at the collective one; every other job starts once, with
Gloo's timeout the collective one unless the environment set another. The elastic jobs of
tests/test_elastic.py check what this buys: a rank that joins later than the collective
timeout is waited for, and a lost rank is still found within it."""
import os

import pytest

from tfsyncmodes import config
from tfsyncmodes.strategies import horovod_start

GLOO = "HOROVOD_GLOO_TIMEOUT_SECONDS"


def expected(elastic, join, collective, given):
    twice = elastic and join > collective and given in (None, str(int(collective)))
    return (int(join), int(collective)) if twice else None


@pytest.mark.parametrize("elastic", [True, False])
@pytest.mark.parametrize("join,collective", [(120, 4), (4, 4), (3, 30), (90.5, 10.9)])
@pytest.mark.parametrize("given", [None, "4", "45"])
def test_horovod_starts_twice_only_for_a_longer_join_in_an_elastic_job(monkeypatch, elastic, join, collective,
                                                                      given):
    if given is None:
        monkeypatch.delenv(GLOO, raising=False)
    else:
        monkeypatch.setenv(GLOO, given)
    resolved = config.resolve({"mode": "sync", "elastic": elastic, "elastic_join_timeout": join,
                               "collective_timeout": collective}, environ={}, use_flags=False)
    assert horovod_start.gloo_timeouts(resolved) == expected(elastic, join, collective, given)
    assert os.environ[GLOO] == (given if given is not None else str(int(collective)))
