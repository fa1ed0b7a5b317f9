"""What a running broker tells the nameservers about itself, and the registrar that does it
(which also takes the cluster's ACL from their answers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metaq.broker.registration import BrokerDescription, NameServerRegistrar
from metaq.common.model import BrokerKey, BrokerState, ReplicationMode, Role
from metaq.common.v1 import control_pb2 as pb

if TYPE_CHECKING:
    from metaq.broker.process import Broker


def nameserver_registrar(broker: Broker) -> NameServerRegistrar:
    """A registrar for ``broker`` that re-announces at once whenever a topic changes."""
    config = broker.config
    assert broker.topics is not None and broker.store is not None
    assert broker.group_role is not None
    topics = broker.topics
    store = broker.store
    group = broker.group_role
    mode = ReplicationMode.SYNC if group.sync else ReplicationMode.ASYNC
    key = BrokerKey(config.broker_name, config.broker_id)

    def describe() -> BrokerDescription:
        state = BrokerState(
            cluster=config.cluster_name,
            key=key,
            role=Role.MASTER if group.replicas is not None else Role.SLAVE,
            data_address=broker.data_address,
            http_address=broker.http_address,
            computer_room=config.computer_room,
            epoch=group.epoch,
            replication_mode=mode,
            commitlog_max_offset=store.commitlog.write_offset,
            controlled=group.controlled,
            configured_master=config.is_master,
            in_sync_ids=group.in_sync_ids(),
            unverified=not group.verified,
        )
        acl_version = broker.acl.acl.version if broker.acl is not None else None
        return BrokerDescription(state, topics, acl_version)

    def on_answer(registered: pb.RegisterBrokerResponse, sent_at: float | None) -> None:
        # The cluster's ACL comes with the answer when it is newer than the broker's.
        if registered.acl and broker.acl is not None:
            broker.acl.adopt_text(registered.acl, "the nameservers")
        group.on_answer(registered, sent_at)

    registrar = NameServerRegistrar(
        list(config.nameservers),
        describe,
        config.heartbeat_interval_ms / 1e3,
        on_answer=on_answer,
        secret=broker.secret,
        tls=config.tls,
    )
    broker.topics.listeners.append(lambda _name: registrar.refresh())
    group.on_change = registrar.refresh
    return registrar
