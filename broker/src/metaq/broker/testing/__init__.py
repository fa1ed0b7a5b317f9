"""Test tools kept with the broker: a real broker process and a minimal data-plane client."""

from metaq.broker.testing.client import BrokerError, DataClient, Reply
from metaq.broker.testing.process import BrokerProcess
from metaq.common.testing import run_async, wait_until

__all__ = ["BrokerError", "BrokerProcess", "DataClient", "Reply", "run_async", "wait_until"]
