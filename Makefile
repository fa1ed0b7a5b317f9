# Entry points for developers and CI. Needs only python3 (3.11) with pip and venv;
# uv is installed into .tools/ when it is not already on PATH.

UV ?= uv
UV_VERSION := 0.13.9
PYTHON ?= python3
TOOLS := .tools

# Fall back to a pinned uv in a local venv when none is on PATH.
ifeq ($(shell command -v $(UV) 2>/dev/null),)
UV := $(TOOLS)/bin/uv
endif
UV_DEP := $(filter $(TOOLS)/bin/uv,$(UV))

MEMBERS := common client replication broker nameserver spark_jobs testing
PYPROJECTS := pyproject.toml $(addsuffix /pyproject.toml,$(MEMBERS))
STAMP := .venv/.setup-stamp

PYTEST_ARGS ?=

.PHONY: setup ci-deps test lint dist deploy-lint deploy-test generate check-generated run store-demo spark-demo bench-spark bench-store bench-dispatch bench-dedup bench-framing bench-idle-poll bench-queues bench-sync-one bench-e2e bench-failover bench-failover-compare bench-features bench-compare bench-accumulation bench-metaq2 bench-scale bench-spark-kafka chaos clean peers peers-kafka peers-rocketmq peers-spark-kafka

setup: $(STAMP)

$(TOOLS)/bin/uv:
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

# Bytecode compiled at install: Spark starts fresh Python processes that import pyspark,
# pyarrow and pandas, and with PYTHONDONTWRITEBYTECODE set nothing else caches it.
$(STAMP): uv.lock $(PYPROJECTS) $(UV_DEP)
	$(UV) sync --frozen --all-packages --compile-bytecode
	touch $@

# The Debian packages the suite needs (nftables, iproute2, ...): installed when missing,
# as root; otherwise a note, and the scenarios that need them skip.
ci-deps:
	sh .ci/system-packages.sh

# Everything CI runs: the lint gate, then the suite but for the deploy lab's playbook runs
# (about six minutes: make deploy-test). Its peer smoke tests start the peers from their
# jars (make peers).
test: lint ci-deps peers
	$(UV) run --frozen pytest -m "not lab" --durations=25 $(PYTEST_ARGS)

# Generated code is checked in; lint fails when it no longer matches common/proto.
lint: setup check-generated deploy-lint
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .
	$(UV) run --frozen mypy

# The Ansible playbooks and roles, at ansible-lint's production profile.
deploy-lint: setup
	$(UV) run --frozen sh -c 'cd deploy/ansible && ANSIBLE_CONFIG=ansible.cfg ansible-lint --offline'

# The playbooks against real sshd hosts in network namespaces (docs/deploy.md); needs root
# and openssh-server (make ci-deps), and skips saying why without them. make test runs
# this folder's quick tests but not the lab's playbook runs (marked `lab`).
deploy-test: setup ci-deps
	$(UV) run --frozen pytest tests/integration/deploy $(PYTEST_ARGS)

# What the Ansible roles install on hosts without internet (docs/deploy.md): the project's
# wheels and a wheelhouse of the pinned dependencies of uv.lock, in dist/.
# make dist DIST_VERSION=0.1.1 rebuilds the wheels under another version string.
DIST_VERSION ?=
dist: setup
	$(PYTHON) deploy/build_dist.py --out dist $(if $(DIST_VERSION),--version $(DIST_VERSION))

# Python modules for common/proto/metaq/v1/*.proto into common/src/metaq/common/v1/.
generate: setup
	$(UV) run --frozen python common/scripts/generate.py

check-generated: setup
	$(UV) run --frozen python common/scripts/generate.py --check

# The main job: a local cluster (one nameserver, two brokers) in the foreground.
# make run RUN_ARGS="--replicas 2": each group a sync pair, to try failover (docs/spark.md)
RUN_ARGS ?=
run: setup
	$(UV) run --frozen python scripts/local_cluster.py $(RUN_ARGS)

# The storage engine on its own: append, read back, restart cleanly and after a crash.
store-demo: setup
	$(UV) run --frozen python -m metaq.broker.store.demo

# The Double-11 live room on Spark (docs/spark.md): a local cluster (or $$METAQ_NAMESERVERS),
# the order generator and live_orders for a bounded time, then the last minute's figures.
# make spark-demo SPARK_MASTER=standalone (or spark://host:7077) runs it with spark-submit.
SPARK_MASTER ?=
SPARK_DEMO_SECONDS ?= 150
spark-demo: setup
	$(UV) run --frozen python scripts/spark_demo.py --seconds $(SPARK_DEMO_SECONDS) \
		$(if $(SPARK_MASTER),--spark-master $(SPARK_MASTER))

# The Spark data source beside Parquet, the consumer and the producer (docs/spark.md);
# last line JSON. make bench-spark SPARK_BENCH_ARGS="--messages 200000"
SPARK_BENCH_ARGS ?=
bench-spark: setup
	$(UV) run --frozen python bench/bench_spark.py $(SPARK_BENCH_ARGS)

# format("metaq") beside Spark's own Kafka source reading the same messages from one Kafka
# broker (docs/benchmarks.md); last line JSON. Spark's Kafka source must match the Spark
# it runs in, and Maven serves none for the locked pyspark: this runs with the pyspark of
# the pom's spark.version, over the project's environment (uv's --with), both sides alike.
# make bench-spark-kafka SPARK_KAFKA_BENCH_ARGS="--messages 50000"
SPARK_KAFKA_PEER := bench/peers/spark-kafka
SPARK_KAFKA_VERSION := $(shell sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' $(SPARK_KAFKA_PEER)/pom.xml)
SPARK_KAFKA_BENCH_ARGS ?=
bench-spark-kafka: setup peers-kafka peers-spark-kafka
	$(UV) run --frozen --with 'pyspark[sql]==$(SPARK_KAFKA_VERSION)' python bench/bench_spark_kafka.py \
		$(SPARK_KAFKA_BENCH_ARGS)

bench-store: setup
	$(UV) run --frozen python bench/bench_store.py

bench-framing: setup
	$(UV) run --frozen python bench/bench_framing.py

# The dispatcher's CPU per record by round size, in process, for both workloads.
bench-dispatch: setup
	$(UV) run --frozen python bench/bench_dispatch_rounds.py --workload sends
	$(UV) run --frozen python bench/bench_dispatch_rounds.py --workload batch

# The id window's index probe per retried batch as the window grows, beside the idempotent
# producers' sequence table (docs/benchmarks.md); last line JSON. DEDUP_BENCH_ARGS="--files 128"
DEDUP_BENCH_ARGS ?=
bench-dedup: setup
	$(UV) run --frozen python bench/bench_dedup.py $(DEDUP_BENCH_ARGS)

# One-at-a-time round trips to a loopback echo server that sleeps, then one that polls
# (the broker's IdlePoll): what a sleeping CPU's wake-up costs.
bench-idle-poll: setup
	$(UV) run --frozen python bench/bench_idle_poll.py

# make bench-queues QUEUES_ARGS="--queues 20000" (the broker's open-file limit bounds it)
QUEUES_ARGS ?=
bench-queues: setup
	$(UV) run --frozen python bench/bench_queue_footprint.py $(QUEUES_ARGS)

# make bench-sync-one SYNC_ONE_ARGS="--rounds 5" (--one-broker for the one-broker row,
#   --body-bytes 128 for the other size of bench-compare)
SYNC_ONE_ARGS ?=
bench-sync-one: setup
	$(UV) run --frozen python bench/bench_sync_one.py $(SYNC_ONE_ARGS)

# Producer throughput and send latency against a real nameserver + broker (ASYNC flush).
bench-e2e: setup
	$(UV) run --frozen python bench/bench_e2e.py

# make bench-failover FAILOVER_ARGS="--only-slow" (or --only-resume, --only-catchup); the
# slow-slave cell runs its group in network namespaces, so it needs root and iproute2.
bench-failover: setup ci-deps
	PYTHONPATH=tests/integration/chaos $(UV) run --frozen python bench/bench_failover.py $(FAILOVER_ARGS)

# kill -9 of the master (leader) under a steady producer, 20 times each, for metaq (3
# replicas, 2 acknowledge), RocketMQ's controller mode and Kafka on KRaft, each checked by
# the chaos checker (docs/benchmarks.md); the histories stay under run-data/failover-compare.
# make bench-failover-compare FAILOVER_COMPARE_ARGS="--kills 2 --only metaq,kafka"
FAILOVER_COMPARE_ARGS ?=
bench-failover-compare: setup ci-deps peers-kafka peers-rocketmq
	PYTHONPATH=tests/integration/chaos:bench $(UV) run --frozen python bench/bench_failover_compare.py \
		$(FAILOVER_COMPARE_ARGS)

bench-features: setup
	$(UV) run --frozen python bench/bench_features.py

# The peers that run from Maven Central's jars (bench/peers/, docs/benchmarks.md), each in
# a git-ignored lib/ of its own; done once, again only when its pom changes.
KAFKA_PEER := bench/peers/kafka
peers: peers-kafka peers-rocketmq

peers-kafka: $(KAFKA_PEER)/lib/.stamp

$(KAFKA_PEER)/lib/.stamp: $(KAFKA_PEER)/pom.xml | ci-deps
	rm -rf $(KAFKA_PEER)/lib
	cd $(KAFKA_PEER) && mvn -q -B dependency:copy-dependencies
	touch $@

# Spark's Kafka source (spark-sql-kafka-0-10) and the Kafka client it reads with, for
# make bench-spark-kafka; Spark's own jars come with pyspark.
peers-spark-kafka: $(SPARK_KAFKA_PEER)/lib/.stamp

$(SPARK_KAFKA_PEER)/lib/.stamp: $(SPARK_KAFKA_PEER)/pom.xml | ci-deps
	rm -rf $(SPARK_KAFKA_PEER)/lib
	cd $(SPARK_KAFKA_PEER) && mvn -q -B dependency:copy-dependencies
	touch $@

# RocketMQ 5: its nameserver, broker, proxy and controller jars and their dependencies in
# target/lib, and the Java client the benchmark drives (src/) in target/rocketmq-bench.jar;
# again when the pom or the client's sources change.
ROCKETMQ_PEER := bench/peers/rocketmq
peers-rocketmq: $(ROCKETMQ_PEER)/target/.stamp

$(ROCKETMQ_PEER)/target/.stamp: $(ROCKETMQ_PEER)/pom.xml $(shell find $(ROCKETMQ_PEER)/src -name '*.java') | ci-deps
	rm -rf $(ROCKETMQ_PEER)/target/lib
	cd $(ROCKETMQ_PEER) && mvn -q -B package dependency:copy-dependencies
	touch $@

# metaq beside NATS JetStream, RabbitMQ (stream, quorum queue) and Redis streams on this
# and Apache Kafka 4 on this machine (docs/benchmarks.md): installs the servers from
# Debian's packages when missing (root), Kafka's jars (make peers-kafka) and the peers'
# clients (the `bench` group), starts and stops every server itself.
# The last line is the JSON object of bench/results/compare.json.
# make bench-compare COMPARE_ARGS="--seconds 2 --only metaq,nats"
# make bench-compare COMPARE_ARGS="--only metaq,kafka,kafka_r3,rocketmq --modes sweep \
#   --chart docs/images/bench-compare-sweep.png" (send latency against throughput)
COMPARE_ARGS ?=
bench-compare: setup peers-kafka peers-rocketmq
	sh bench/install_peers.sh
	$(UV) sync --frozen --all-packages --group bench
	$(UV) run --frozen --group bench python bench/bench_compare.py $(COMPARE_ARGS)

# Consumers catching up on a backlog (docs/benchmarks.md): warm, beside RabbitMQ stream,
# NATS JetStream and Redis streams, and cold (1.5x memory on disk, page cache dropped)
# while a producer sends at 20,000 msgs/s; then one consumer draining a 10 GB backlog warm
# and cold (page cache dropped), beside Kafka 4's consumers and RocketMQ 5's, one system's
# data at a time. Needs root for the peers' packages and the cache drop, and about 40 GB
# free for the cold phase; the last line is a JSON object.
# make bench-accumulation ACCUMULATION_ARGS="--warm-messages 200000 --cold-gib 2"
# make bench-accumulation ACCUMULATION_ARGS="--only backlog --backlog-gb 4"
ACCUMULATION_ARGS ?=
bench-accumulation: setup peers-kafka peers-rocketmq
	sh bench/install_peers.sh
	$(UV) sync --frozen --all-packages --group bench
	$(UV) run --frozen --group bench python bench/bench_accumulation.py $(ACCUMULATION_ARGS)

# MetaQ 2.0's performance table (flush mode x partitions x size) run against metaq here,
# printed beside the original figures; the last line is a JSON object.
METAQ2_ARGS ?=
bench-metaq2: setup
	$(UV) run --frozen python bench/bench_metaq2.py $(METAQ2_ARGS)

# Queues per broker, 16 to 100,000 (docs/benchmarks.md): append rate, RSS, descriptors,
# mappings, start-up and recovery; then three nameservers under 10 to 1,000 simulated
# broker groups and 1,000 to 20,000 clients (bench/bench_scale_nameserver.py); consumer
# groups committing every second (1 to 100,000), assignment (10 to 10,000 consumers) and
# creating 10,000 topics (bench/scale_*.py); the charts into docs/images, the last line JSON.
# make bench-scale SCALE_ARGS="--points 16,1000 --seconds 3 --ns-points 10:1000,100:5000"
SCALE_ARGS ?=
bench-scale: setup
	$(UV) sync --frozen --all-packages --group bench
	$(UV) run --frozen --group bench python bench/bench_scale.py --chart docs/images/bench-scale-queues.png $(SCALE_ARGS)

# The chaos suite (docs/chaos.md): every scenario on network namespaces (needs root; falls
# back to loopback and says so), a checker table each, one JSON line last.
# make chaos SEED=7 DURATION=600 ONLY=1,3; SYSTEM=kafka runs scenario 1 against Kafka on
# three KRaft nodes on loopback (bench/peer_kafka.py), SYSTEM=rocketmq against RocketMQ's
# controller mode, three brokers (bench/peer_rocketmq.py), checked the same way.
SEED ?= 1
DURATION ?= 120
ONLY ?=
SYSTEM ?= metaq
KAFKA_CHAOS := $(filter kafka,$(SYSTEM))
ROCKETMQ_CHAOS := $(filter rocketmq,$(SYSTEM))
PEER_CHAOS := $(KAFKA_CHAOS)$(ROCKETMQ_CHAOS)
chaos: setup ci-deps $(if $(KAFKA_CHAOS),peers-kafka) $(if $(ROCKETMQ_CHAOS),peers-rocketmq)
	PYTHONPATH=tests/integration/chaos$(if $(PEER_CHAOS),:bench) $(UV) run --frozen python -m chaoslib.run \
		--system $(SYSTEM) --seed $(SEED) --duration $(DURATION) $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf .venv $(TOOLS) .pytest_cache .mypy_cache .ruff_cache .hypothesis run-data
	find . -name __pycache__ -type d -not -path './.git/*' -prune -exec rm -rf {} +
