"""format("metaq") against a cluster with users and TLS on every listener (client
certificates required): a user given by ``accessKey``/``secretKeyFile`` writes and reads
back with the TLS options; with no user, a wrong secret or a user without the grant, the
read and the write fail at planning saying which."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.users import Credentials, Verifier
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.waiting import run_async

TOPIC = "spark-secured"
ADMIN = Credentials("admin", "admin-secret-key-for-the-spark-auth-test")
APP = Credentials("spark-app", "spark-app-secret-key-for-the-spark-auth-test")
OUTSIDER = Credentials("outsider", "outsider-secret-key-for-the-spark-auth-test")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("spark-secured")
    table = Acl()
    for c in (ADMIN, APP, OUTSIDER):
        table = table.with_user(User(c.access_key, Verifier.make(c.access_key, c.secret_key)))
    table = table.grant(ADMIN.access_key, Grant("admin", "cluster"))
    # The source's own groups (spark-planner, spark-reader) are covered by the prefix.
    for permission, resource in (
        ("pub", f"topic:{TOPIC}"), ("sub", f"topic:{TOPIC}"), ("sub", "group:spark-*"),
    ):  # fmt: skip
        table = table.grant(APP.access_key, Grant.parse(permission, resource))
    acl_file = work / "acl.json"
    acl.save(acl_file, table)
    cluster = ClusterBuilder(
        tls=True, verify_client=True, auth=True, acl_file=acl_file, admin=ADMIN
    ).start(work / "cluster")
    try:
        run_async(cluster.create_topic(TOPIC, queues=2))
        yield cluster
    finally:
        cluster.stop()


def secret_file(tmp_path: Path, user: Credentials) -> str:
    path = tmp_path / f"{user.access_key}.secret"
    path.write_text(user.secret_key + "\n")
    path.chmod(0o600)
    return str(path)


def tls_options(cluster: Cluster) -> dict[str, str]:
    assert cluster.pki is not None
    return {
        "nameservers": cluster.nameserver_list,
        "tlsCaFile": cluster.pki.ca_file,
        "tlsCertFile": cluster.pki.client.cert_file,
        "tlsKeyFile": cluster.pki.client.key_file,
    }


def test_a_user_given_as_options_writes_and_reads_over_tls(
    spark: Any, secured: Cluster, tmp_path: Path
) -> None:
    options = {
        **tls_options(secured),
        "accessKey": APP.access_key,
        "secretKeyFile": secret_file(tmp_path, APP),
    }
    df = spark.range(50).select(F.concat(F.lit("secured-"), F.col("id").cast("string")))
    df = df.toDF("body")
    df.write.format("metaq").mode("append").options(**options).option("topic", TOPIC).save()
    rows = spark.read.format("metaq").options(**options).option("topic", TOPIC).load().collect()
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(f"secured-{i}" for i in range(50))


@pytest.mark.parametrize(
    ("user", "words"),
    [
        (None, ["'accessKey' and 'secretKeyFile'", "requires a user", "sent unsigned"]),
        (
            Credentials(APP.access_key, "not-the-secret-key-of-spark-app"),
            ["'accessKey' and 'secretKeyFile'", "sent as user spark-app"],
        ),
        (OUTSIDER, ["option 'accessKey'", "outsider lacks pub and sub on topic spark-secured"]),
    ],
    ids=["no-user", "wrong-secret", "no-grant"],
)
def test_a_read_or_write_without_a_user_allowed_fails_at_planning_saying_so(
    spark: Any, secured: Cluster, tmp_path: Path, user: Credentials | None, words: list[str]
) -> None:
    options = tls_options(secured)
    if user is not None:
        options |= {"accessKey": user.access_key, "secretKeyFile": secret_file(tmp_path, user)}
    reader = spark.read.format("metaq").options(**options).option("topic", TOPIC)
    with pytest.raises(AnalysisException) as failure:
        reader.load().collect()
    first = str(failure.value).splitlines()[0]
    for word in words:
        assert word in first, first
    df = spark.range(1).selectExpr("'x' AS body")
    with pytest.raises(AnalysisException) as failure:
        df.write.format("metaq").mode("append").options(**options).option("topic", TOPIC).save()
    first = str(failure.value).splitlines()[0]
    for word in words:
        assert word in first, first
