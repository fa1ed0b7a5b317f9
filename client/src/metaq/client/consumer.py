"""The consumer API: pull consumers, push consumers and their settings, in one import.

- :class:`PullConsumer` (:mod:`metaq.client.pull_consumer`): pull a named queue at a
  named offset; commit and look up a group's offsets; the caller drives everything.
- :class:`PushConsumer` (:mod:`metaq.client.push_consumer`): subscribe handlers; the
  consumer joins its group, takes its share of the queues, long-polls them, runs the
  handlers with bounded concurrency and commits offsets that never pass an unfinished
  message.
"""

from metaq.client.consume_options import (
    BROADCASTING,
    CLUSTERING,
    FIRST,
    LAST,
    STRATEGIES,
    TIMESTAMP,
    ConsumeFrom,
    PushConsumerConfig,
)
from metaq.client.handlers import LATER, ConsumeResult, ConsumeStats
from metaq.client.message import Message
from metaq.client.pull_consumer import (
    PullConsumer,
    PullResult,
    PullStatus,
    QueueNotRouted,
    QueueOffsets,
)
from metaq.client.push_consumer import BatchHandler, MessageHandler, PushConsumer, QueueKey
from metaq.common.model import ConsumeMode, QueueRoute

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "FIRST",
    "LAST",
    "LATER",
    "STRATEGIES",
    "TIMESTAMP",
    "BatchHandler",
    "ConsumeFrom",
    "ConsumeMode",
    "ConsumeResult",
    "ConsumeStats",
    "Message",
    "MessageHandler",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerConfig",
    "QueueKey",
    "QueueNotRouted",
    "QueueOffsets",
    "QueueRoute",
]
