"""Rank 0's result bytes: header and weights round-trip, the driver may add to the header, and
a payload cut short on its way is refused by name rather than as a zip-reader error."""

from __future__ import annotations

import pytest
import torch

from sparkdist.exceptions import TrainingError
from sparkdist.torchtrain import launch, loop


def test_weights_and_header_round_trip_and_the_driver_may_add_to_the_header():
    payload = loop.pack_result({"w": torch.arange(6.0).reshape(2, 3)}, {"history": [1]})
    state, header = loop.unpack_result(launch.with_header(bytes(payload), worker_counts=[2]))
    assert torch.equal(state["w"], torch.arange(6.0).reshape(2, 3))
    assert header == {"history": [1], "worker_counts": [2]}


@pytest.mark.parametrize("kept", [0.3, 0.9, 0.999])
def test_a_truncated_payload_is_refused_with_the_fix(kept):
    payload = loop.pack_result({"w": torch.zeros(1000)}, {"history": []})
    with pytest.raises(TrainingError, match="incomplete.*spark.driver.memory"):
        loop.unpack_result(payload[:int(len(payload) * kept)])
