"""metaq's client: producer, consumers, the admin library and the ``metaq`` CLI.

The public API is importable from here::

    from metaq.client import Admin, Producer, PushConsumer, ConsumeResult

Submodules hold the details (``metaq.client.producer``, ``metaq.client.consumer``, ...).
"""

from metaq.client.admin import Admin, TopicSettings
from metaq.client.consume_options import (
    BROADCASTING,
    CLUSTERING,
    FIRST,
    LAST,
    TIMESTAMP,
    ConsumeFrom,
    PushConsumerConfig,
)
from metaq.client.errors import (
    AdminError,
    BrokerAdminError,
    BrokerAnswerUnreadable,
    BrokerError,
    BrokerUnreachable,
    ConnectionLost,
    NoNameServer,
    NoWritableQueue,
    ProducerClosed,
    RequestTimeout,
    UnknownTopic,
)
from metaq.client.handlers import LATER, ConsumeResult, ReconsumeLater
from metaq.client.message import Message
from metaq.client.producer import Producer, ProducerConfig
from metaq.client.pull_consumer import PullConsumer, PullResult, PullStatus, QueueOffsets
from metaq.client.push_consumer import PushConsumer
from metaq.client.results import SendResult, SendStatus
from metaq.client.routes import NameServerError, RouteCache
from metaq.client.transaction import TransactionProducer, TransactionState
from metaq.common.errors import MetaqError
from metaq.common.model import ConsumeMode, TopicRoute

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "FIRST",
    "LAST",
    "LATER",
    "TIMESTAMP",
    "Admin",
    "AdminError",
    "BrokerAdminError",
    "BrokerAnswerUnreadable",
    "BrokerError",
    "BrokerUnreachable",
    "ConnectionLost",
    "ConsumeFrom",
    "ConsumeMode",
    "ConsumeResult",
    "Message",
    "MetaqError",
    "NameServerError",
    "NoNameServer",
    "NoWritableQueue",
    "Producer",
    "ProducerClosed",
    "ProducerConfig",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerConfig",
    "QueueOffsets",
    "ReconsumeLater",
    "RequestTimeout",
    "RouteCache",
    "SendResult",
    "SendStatus",
    "TopicRoute",
    "TopicSettings",
    "TransactionProducer",
    "TransactionState",
    "UnknownTopic",
]
