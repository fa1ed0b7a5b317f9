"""The admin library: cluster, topics, consumer groups, messages and failover.

:class:`Admin` is what the ``metaq`` CLI, the nameservers' console, Spark's planner and
the tests call instead of speaking HTTP or gRPC themselves (RocketMQ's
``DefaultMQAdminExt`` serves its ``mqadmin`` and its dashboard the same way). It talks to
the nameservers over gRPC (cluster info, routes, assignment, the controller's
switchover), to the brokers' HTTP admin APIs (topics, health, metrics, consumers,
message lookups, handover) and, for offsets and dead letters, through the data-plane
consumer and producer. Its calls live by area in this package's modules
(:mod:`~metaq.client.admin.session` lists them); this one joins them.
"""

from __future__ import annotations

from metaq.client.admin.acl import AclAdmin
from metaq.client.admin.groups import GroupAdmin
from metaq.client.admin.messages import MessageAdmin


class Admin(GroupAdmin, MessageAdmin, AclAdmin):
    """Administer a metaq cluster; an async context manager, like the producer.

    ``nameservers`` are asked for what the cluster is (any one will do; see
    :class:`~metaq.client.routes.RouteCache`); without them only the broker-level calls
    (those taking a broker) work. Every call is bounded by ``timeout_s``. ``credentials``
    (by default from ``METAQ_CREDENTIALS_FILE`` or ``METAQ_ACCESS_KEY`` /
    ``METAQ_SECRET_KEY``) sign every call on clusters with auth; ``cluster_secret`` is
    what the controller requires for a switchover. With ``tls`` every call is TLS.
    ``routes`` shares another client's route cache (and its nameserver channels).

    Use it as an async context manager (or call :meth:`close`): calls then share one HTTP
    session and one set of connections. A call that takes a broker also works on an Admin
    made just for it (``await Admin().health(address)``): it opens and closes its own
    session.

    Failures raise :class:`~metaq.client.errors.AdminError` (a broker's refusal:
    :class:`~metaq.client.errors.BrokerAdminError`, with its HTTP status), or the client's
    usual :class:`~metaq.client.errors.NoNameServer` and
    :class:`~metaq.client.errors.UnknownTopic`; every message says what to do.
    """
