#!/bin/sh
# The peers of bench_compare.py from Debian's packages: nats-server, rabbitmq-server and
# redis-server, installed when missing and never left running or enabled. The benchmark
# starts its own copies by hand, on loopback, and stops them.
set -eu

need=""
command -v nats-server >/dev/null 2>&1 || need="$need nats-server"
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need="$need rabbitmq-server"
command -v redis-server >/dev/null 2>&1 || need="$need redis-server"
[ -z "$need" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "install_peers.sh: installing$need needs root (or install them first)" >&2
    exit 1
fi

# Exit code 101 from policy-rc.d tells the packages' scripts not to start their services.
added_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    added_policy=1
fi
cleanup() {
    if [ -n "$added_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
}
trap cleanup EXIT

apt-get update -q
# shellcheck disable=SC2086  # one word per package
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $need

# Under systemd the units are still enabled for the next boot: disable (and stop) them.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    for unit in rabbitmq-server redis-server nats-server epmd.socket epmd.service; do
        systemctl disable --now "$unit" >/dev/null 2>&1 || true
    done
fi
