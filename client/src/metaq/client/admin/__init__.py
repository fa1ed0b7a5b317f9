"""The admin library (:class:`Admin`) and what it returns."""

from metaq.client.admin.client import (
    ADMIN_GROUP,
    Admin,
    BrokerRef,
    TopicExists,
    TopicMissing,
    TopicPlacement,
    TopicSettingsError,
)
from metaq.client.admin.results import (
    MAX_QUEUES,
    MIN_QUEUES,
    BrokerHealth,
    CommittedOffset,
    MetricSamples,
    QueueProgress,
    QueueReset,
    QueueStats,
    StoredMessage,
    SwitchoverResult,
    TopicListing,
    TopicSettings,
)

__all__ = [
    "ADMIN_GROUP",
    "MAX_QUEUES",
    "MIN_QUEUES",
    "Admin",
    "BrokerHealth",
    "BrokerRef",
    "CommittedOffset",
    "MetricSamples",
    "QueueProgress",
    "QueueReset",
    "QueueStats",
    "StoredMessage",
    "SwitchoverResult",
    "TopicExists",
    "TopicListing",
    "TopicMissing",
    "TopicPlacement",
    "TopicSettings",
    "TopicSettingsError",
]
