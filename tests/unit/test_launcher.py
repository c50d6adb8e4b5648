"""run.launcher.stopped_on_failure: a started process that fails its check is stopped."""

from __future__ import annotations

import pytest
from triton_embed_server.run.launcher import stopped_on_failure


@pytest.mark.parametrize("error", [RuntimeError("not ready"), KeyboardInterrupt()])
def test_stopped_on_failure_stops_and_reraises(error):
    stops = []
    with pytest.raises(type(error)) as info, stopped_on_failure(lambda: stops.append(1)):
        raise error
    assert info.value is error
    assert stops == [1]


def test_stopped_on_failure_leaves_a_good_start_running():
    stops = []
    with stopped_on_failure(lambda: stops.append(1)):
        pass
    assert stops == []
