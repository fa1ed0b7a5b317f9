"""The data source's options: parsed and validated on the driver, before any task runs.

Names follow Spark's Kafka source where one exists and are case-insensitive, as Spark's
options are; the shared loader (:mod:`metaq.common.config`) types them. Anything wrong
raises :class:`OptionError` naming the option, what was wrong and what is accepted, so a
job fails at planning instead of inside an executor.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec

from metaq.client.tags import TagFilter
from metaq.common.config import ConfigError, Schema, Setting
from metaq.common.tls import TlsConfig, TlsError

EARLIEST: Final = -2
LATEST: Final = -1
"""Offset sentinels inside a JSON offsets option, as in the Kafka source."""

QueueOffsets = dict[str, dict[str, int]]
"""{topic: {"broker:queue": offset}}: the JSON form of starting/ending offsets."""


class OptionError(ConfigError):
    """An option of ``format("metaq")`` is missing, unknown or malformed."""


@dataclass(frozen=True)
class SourceOptions:
    """What a read (batch or stream) was asked for."""

    nameservers: tuple[str, ...]
    topics: tuple[str, ...] = ()
    topic_pattern: str = ""
    starting: str | QueueOffsets = "earliest"
    ending: str | QueueOffsets = "latest"
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    tags: str = "*"
    consumer_group: str = ""
    max_messages_per_trigger: int = 0
    """0: no limit per micro-batch."""
    min_partitions: int = 0
    fail_on_data_loss: bool = True
    pull_batch_messages: int = 1024
    request_timeout_s: float = 10.0
    tls: TlsConfig | None = None
    """Set: nameservers and brokers are reached over TLS (options ``tls``, ``tlsCaFile``,
    ``tlsCertFile``, ``tlsKeyFile``; the files at the same paths on every executor)."""

    def matches(self, topic: str) -> bool:
        if self.topic_pattern:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


@dataclass(frozen=True)
class SinkOptions:
    """What a write was asked for."""

    nameservers: tuple[str, ...]
    topic: str = ""
    """The topic of rows without a ``topic`` column value."""
    producer_group: str = "spark-writer"
    batch_messages: int = 256
    request_timeout_s: float = 10.0
    tls: TlsConfig | None = None


_POSITIVE = Annotated[int, msgspec.Meta(ge=1)]
_NOT_NEGATIVE = Annotated[int, msgspec.Meta(ge=0)]
_SHARED: Final[dict[str, Any]] = {
    "nameservers": str,
    "topic": str,
    "requestTimeoutMs": _POSITIVE,
    "tls": bool,
    "tlsCaFile": str,
    "tlsCertFile": str,
    "tlsKeyFile": str,
}
_SOURCE: Final = Schema(
    {
        **_SHARED,
        "topics": str,
        "topicPattern": str,
        "startingOffsets": str,
        "endingOffsets": str,
        "startingTimestamp": _NOT_NEGATIVE,
        "endingTimestamp": _NOT_NEGATIVE,
        "tags": str,
        "consumerGroup": str,
        "maxMessagesPerTrigger": _POSITIVE,
        "minPartitions": _POSITIVE,
        "failOnDataLoss": bool,
        "pullBatchMessages": _POSITIVE,
    },
    noun="option",
    error=OptionError,
)
_SINK: Final = Schema(
    {**_SHARED, "producerGroup": str, "batchMessages": _POSITIVE},
    noun="option",
    error=OptionError,
)
_SPARK_KEYS: Final = ("path", "checkpointlocation", "queryname")
# The options that set a field of the same value, when given.
_SOURCE_FIELDS: Final = {
    "startingTimestamp": "starting_timestamp_ms",
    "endingTimestamp": "ending_timestamp_ms",
    "maxMessagesPerTrigger": "max_messages_per_trigger",
    "minPartitions": "min_partitions",
    "failOnDataLoss": "fail_on_data_loss",
    "pullBatchMessages": "pull_batch_messages",
}
_SINK_FIELDS: Final = {"producerGroup": "producer_group", "batchMessages": "batch_messages"}


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The read options, validated; raises OptionError naming what is wrong."""
    opts = _read(options, _SOURCE)
    chosen = [k for k in ("topic", "topics", "topicPattern") if opts.get(k)]
    if len(chosen) != 1:
        raise OptionError(
            "exactly one of the options 'topic', 'topics' (comma list) or 'topicPattern' "
            f"(regex) is needed; got {_names(chosen) or 'none'}"
        )
    topics: tuple[str, ...] = ()
    pattern = ""
    if chosen[0] == "topicPattern":
        pattern = opts["topicPattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option 'topicPattern' {pattern!r} is not a regex: {exc}") from None
    else:
        topics = tuple(dict.fromkeys(t.strip() for t in opts[chosen[0]].split(",") if t.strip()))
        if not topics:
            raise OptionError(f"option {chosen[0]!r} names no topic")
    starting = _offsets("startingOffsets", opts.get("startingOffsets", "earliest"))
    ending = _offsets("endingOffsets", opts.get("endingOffsets", "latest"))
    if streaming and "endingOffsets" in opts:
        raise OptionError("option 'endingOffsets' is for batch reads only; a stream has no end")
    if streaming and "endingTimestamp" in opts:
        raise OptionError("option 'endingTimestamp' is for batch reads only; a stream has no end")
    if ending == "earliest":
        raise OptionError("option 'endingOffsets' cannot be 'earliest'; use 'latest' or JSON")
    if isinstance(ending, dict) and any(v == EARLIEST for q in ending.values() for v in q.values()):
        raise OptionError("option 'endingOffsets' cannot hold -2 (earliest)")
    latest_inside = isinstance(starting, dict) and any(
        v == LATEST for q in starting.values() for v in q.values()
    )
    if latest_inside and not streaming:
        raise OptionError("option 'startingOffsets' cannot hold -1 (latest) in a batch read")
    if starting == "latest" and not streaming:
        raise OptionError("option 'startingOffsets' cannot be 'latest' in a batch read")
    tags = TagFilter.parse(opts.get("tags", "*"))
    group = opts.get("consumerGroup", "")
    if group:
        from metaq.common.names import check_group

        try:
            check_group(group)
        except Exception as exc:
            raise OptionError(f"option 'consumerGroup' {group!r}: {exc}") from None
    return SourceOptions(
        nameservers=_nameservers(opts),
        topics=topics,
        topic_pattern=pattern,
        starting=starting,
        ending=ending,
        tags=tags.expression,
        consumer_group=group,
        request_timeout_s=opts.get("requestTimeoutMs", 10_000) / 1000,
        tls=_tls(opts),
        **{field: opts[name] for name, field in _SOURCE_FIELDS.items() if name in opts},
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _read(options, _SINK)
    return SinkOptions(
        nameservers=_nameservers(opts),
        topic=opts.get("topic", "").strip(),
        request_timeout_s=opts.get("requestTimeoutMs", 10_000) / 1000,
        tls=_tls(opts),
        **{field: opts[name] for name, field in _SINK_FIELDS.items() if name in opts},
    )


def _read(options: Mapping[str, str], schema: Schema) -> dict[str, Any]:
    """The options by their own spelling, typed. Spark's options are case-insensitive, and
    its own (path, checkpointLocation, queryName) reach every source and sink."""
    settings = {}
    for name, value in options.items():
        lowered = str(name).lower()
        if value is None or lowered in _SPARK_KEYS:
            continue
        key = schema.canonical(lowered)
        if key is None:
            raise schema.unknown(lowered, "format('metaq')")
        settings[key] = Setting(str(value), f"option {key!r}", text=True)
    return schema.values(settings)


def _tls(opts: Mapping[str, Any]) -> TlsConfig | None:
    """TLS when ``tls`` is true or any of its files is named; the files are read here, on
    the driver, so a wrong path fails the job at planning."""
    files = [opts.get(key, "").strip() for key in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")]
    if not (opts.get("tls", False) or any(files)):
        return None
    ca, cert, key = files
    try:
        tls = TlsConfig(cert_file=cert, key_file=key, ca_file=ca)
        tls.check()
    except TlsError as exc:
        message = str(exc)
        for setting, option in (
            ("tls_ca_file", "tlsCaFile"),
            ("tls_cert_file", "tlsCertFile"),
            ("tls_key_file", "tlsKeyFile"),
        ):
            message = message.replace(setting, f"option {option!r}")
        raise OptionError(message) from None
    return tls


def _names(keys: list[str]) -> str:
    return ", ".join(repr(k) for k in keys)


def _nameservers(opts: Mapping[str, Any]) -> tuple[str, ...]:
    raw = opts.get("nameservers") or os.environ.get("METAQ_NAMESERVERS", "")
    found = tuple(a.strip() for a in raw.split(",") if a.strip())
    if not found:
        raise OptionError(
            "option 'nameservers' (host:port, comma list) is needed, or METAQ_NAMESERVERS"
        )
    for address in found:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"option 'nameservers': {address!r} is not host:port")
    return found


def _offsets(name: str, value: str) -> str | QueueOffsets:
    raw = value.strip()
    if raw.lower() in ("earliest", "latest"):
        return raw.lower()
    example = '{"orders": {"broker-a:0": 42, "broker-a:1": -2}}'
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"option {name!r} is neither earliest, latest nor JSON ({exc}); e.g. {example}"
        ) from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {name!r} must be a JSON object like {example}")
    result: QueueOffsets = {}
    for topic, queues in parsed.items():
        if not isinstance(queues, dict):
            raise OptionError(f"option {name!r}: topic {topic!r} must map to an object {example}")
        result[topic] = {}
        for queue, offset in queues.items():
            broker, sep, qid = str(queue).rpartition(":")
            if not sep or not broker or not qid.isdigit():
                raise OptionError(
                    f"option {name!r}: queue {queue!r} of {topic!r} is not 'broker:queue-id'"
                )
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(
                    f"option {name!r}: offset of {topic}/{queue} must be an integer >= -2 "
                    f"(-2 earliest, -1 latest), got {offset!r}"
                )
            result[topic][queue] = offset
    return result
