#!/bin/sh
# The Debian packages the test suite needs beyond Python, installed when missing:
# nftables (nft: the chaos suite's partitions and packet loss), iproute2 (ip, tc: its
# network namespaces), e2fsprogs and mount (mkfs.ext4, mount: the disk-full scenario's
# small loop-mounted filesystem), openssh-server (sshd: the Ansible deploy test's hosts,
# one sshd per network namespace), systemd (systemd-analyze verify: the deploy role's
# units, checked offline; nothing is started), logrotate (the deploy role's rotation of
# the control script's logs, run on files of a test's own), prometheus (with promtool: the monitoring tests),
# chromium (the web console's browser tests). Without them those scenarios skip and
# say why, so a machine that cannot install (not root, no apt-get) gets a note and
# the suite runs on.
set -eu

need=""
command -v nft >/dev/null 2>&1 || need="$need nftables"
{ command -v ip && command -v tc; } >/dev/null 2>&1 || need="$need iproute2"
command -v mkfs.ext4 >/dev/null 2>&1 || need="$need e2fsprogs"
command -v mount >/dev/null 2>&1 || need="$need mount"
[ -x /usr/sbin/sshd ] || need="$need openssh-server"
[ -x /usr/bin/systemd-analyze ] || need="$need systemd"
[ -x /usr/sbin/logrotate ] || need="$need logrotate"
# Java 17 runs Spark for the spark_jobs tests (pyspark 4.3).
command -v java >/dev/null 2>&1 || need="$need openjdk-17-jre-headless"
# Maven resolves the benchmark peers' jars (make peers: Apache Kafka, RocketMQ), whose
# smoke tests are part of the suite; the JDK's compiler builds RocketMQ's Java client.
command -v javac >/dev/null 2>&1 || need="$need openjdk-17-jdk-headless"
command -v mvn >/dev/null 2>&1 || need="$need maven"
# prometheus (with promtool): the monitoring tests scrape a real cluster and run the
# alert rules' unit tests.
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need="$need prometheus"
# openssl: the Ansible role's TLS tasks make certificates with it (their test runs them),
# and a TLS test encrypts a key with it.
command -v openssl >/dev/null 2>&1 || need="$need openssl"
# The web console's browser tests drive Debian's Chromium through Playwright (never a
# browser Playwright downloads).
[ -x /usr/bin/chromium ] || need="$need chromium"
[ -z "$need" ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-packages.sh: not installing$need (needs root and apt-get):" \
        "the chaos scenarios and the deploy test that need them will be skipped" >&2
    exit 0
fi

echo "system-packages.sh: installing$need" >&2
apt-get update -q
# shellcheck disable=SC2086  # one word per package
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $need
