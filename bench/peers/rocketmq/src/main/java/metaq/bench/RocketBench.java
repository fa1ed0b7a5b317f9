package metaq.bench;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.body.BrokerReplicasInfo;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * RocketMQ's own Java client (remoting protocol) driven by bench/peer_rocketmq.py: one
 * command per line on stdin (or one on the command line), one {@code RESULT {json}} line
 * per command on stdout. Everything else the client libraries print is not a result.
 *
 * <pre>
 * wait BROKERS SECONDS                       until the nameserver lists BROKERS brokers, a master among them
 * topic TOPIC QUEUES                         create TOPIC on every master, wait until a send to it
 *                                            is acknowledged (a SYNC_MASTER's slave connected)
 * group GROUP                                create consumer GROUP on every master (gRPC consumers
 *                                            find no group otherwise)
 * one TOPIC SIZE SECONDS MAX [latencies]     synchronous sends, one at a time (each latency too)
 * many TOPIC SIZE SECONDS MAX IN_FLIGHT      asynchronous sends, at most IN_FLIGHT unanswered
 * rate TOPIC SIZE SECONDS RATE IN_FLIGHT     asynchronous sends offered at RATE msgs/s
 * e2e TOPIC SIZE SECONDS RATE WARMUP         as rate, consumed back by a push consumer here
 * smoke TOPIC                                send one message and consume it back
 * master CONTROLLER GROUP                    the controller's master of GROUP (null while none)
 *                                            and how many replicas it counts in sync
 * paced_ids TOPIC ID_PREFIX RATE TIMEOUT_MS  synchronous sends of ids ID_PREFIX-0, -1, ... at RATE/s
 *                                            until a line arrives on stdin: an EVENT line each
 *                                            invoke and each answer (ok, or info with the error)
 * read_all TOPIC                             every message of TOPIC from its start to its end now,
 *                                            an EVENT line each (the chaos suite's checker reads them)
 * drain TOPIC GROUP SECONDS                  a lite pull consumer of GROUP, every queue from its start
 *                                            to its end now: messages, body bytes, seconds and this
 *                                            JVM's CPU seconds from the first poll to the last message
 * </pre>
 *
 * Latencies are in milliseconds: of each send to its answer, or (rate, e2e) from the
 * moment the schedule said to send to the answer or to the consumer's callback, so that
 * a stall shows as latency instead of a lower rate.
 */
public final class RocketBench {
    private static final long SEND_TIMEOUT_MS = 10_000;
    private static final long TICK_NS = 1_000_000;
    private static final long DRAIN_MS = 30_000;
    private static final int MAX_SAMPLES = 10_000_000;
    private static final String WARMUP_TAG = "warmup";

    private final String namesrv;
    private final PrintStream out;
    private DefaultMQProducer producer;

    private RocketBench(String namesrv, PrintStream out) {
        this.namesrv = namesrv;
        this.out = out;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: RocketBench NAMESRV_ADDR [COMMAND ARGS...]; commands on stdin without one");
            System.exit(2);
        }
        // The client libraries log to stdout too; results go to the real stdout only.
        PrintStream results = System.out;
        System.setOut(System.err);
        RocketBench bench = new RocketBench(args[0], results);
        try {
            if (args.length > 1) {
                bench.run(Arrays.copyOfRange(args, 1, args.length));
            } else {
                BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
                String line;
                while ((line = in.readLine()) != null) {
                    String[] words = line.trim().split("\\s+");
                    if (words.length == 0 || words[0].isEmpty()) {
                        continue;
                    }
                    if (words[0].equals("quit")) {
                        break;
                    }
                    bench.run(words);
                }
            }
        } finally {
            bench.close();
        }
        System.exit(0);
    }

    private void run(String[] w) {
        Map<String, Object> result;
        try {
            switch (w[0]) {
                case "wait" -> result = waitBrokers(Integer.parseInt(w[1]), seconds(w[2]));
                case "topic" -> result = topic(w[1], Integer.parseInt(w[2]));
                case "group" -> result = group(w[1]);
                case "one" -> result = one(w[1], size(w[2]), seconds(w[3]), Long.parseLong(w[4]),
                    w.length > 5 && w[5].equals("latencies"));
                case "many" -> result = many(w[1], size(w[2]), seconds(w[3]), Long.parseLong(w[4]),
                    Integer.parseInt(w[5]));
                case "rate" -> result = rate(w[1], size(w[2]), seconds(w[3]), Double.parseDouble(w[4]),
                    Integer.parseInt(w[5]));
                case "e2e" -> result = e2e(w[1], size(w[2]), seconds(w[3]), Double.parseDouble(w[4]),
                    seconds(w[5]));
                case "smoke" -> result = smoke(w[1]);
                case "master" -> result = master(w[1], w[2]);
                case "paced_ids" -> result = pacedIds(w[1], w[2], Double.parseDouble(w[3]), Long.parseLong(w[4]));
                case "read_all" -> result = readAll(w[1]);
                case "drain" -> result = drainBacklog(w[1], w[2], seconds(w[3]));
                default -> throw new IllegalArgumentException("unknown command " + w[0]
                    + "; one of wait, topic, group, one, many, rate, e2e, smoke, master, paced_ids, read_all, drain, quit");
            }
        } catch (Throwable e) {
            e.printStackTrace();
            result = new HashMap<>();
            result.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        out.println("RESULT " + json(result));
        out.flush();
    }

    private static int size(String word) {
        return Integer.parseInt(word);
    }

    private static long seconds(String word) {
        return (long) (Double.parseDouble(word) * 1e9);
    }

    private DefaultMQProducer producer() throws Exception {
        if (producer == null) {
            DefaultMQProducer p = new DefaultMQProducer("bench_producer_" + ProcessHandle.current().pid());
            p.setNamesrvAddr(namesrv);
            p.setSendMsgTimeout((int) SEND_TIMEOUT_MS);
            // Bodies are random bytes: nothing to gain from compressing them.
            p.setCompressMsgBodyOverHowmuch(Integer.MAX_VALUE);
            p.start();
            producer = p;
        }
        return producer;
    }

    private void close() {
        if (producer != null) {
            producer.shutdown();
        }
    }

    private DefaultMQAdminExt admin() throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName("bench_admin_" + System.nanoTime());
        admin.start();
        return admin;
    }

    /** Until the nameserver lists {@code brokers} broker addresses in all, a master among them. */
    private Map<String, Object> waitBrokers(int brokers, long ns) throws Exception {
        DefaultMQAdminExt admin = admin();
        try {
            long deadline = System.nanoTime() + ns;
            String seen = "nothing";
            while (System.nanoTime() < deadline) {
                try {
                    ClusterInfo cluster = admin.examineBrokerClusterInfo();
                    seen = cluster.getBrokerAddrTable().toString();
                    int listed = 0;
                    boolean master = false;
                    for (BrokerData b : cluster.getBrokerAddrTable().values()) {
                        listed += b.getBrokerAddrs().size();
                        master |= b.getBrokerAddrs().containsKey(0L);
                    }
                    if (listed >= brokers && master) {
                        Map<String, Object> r = new HashMap<>();
                        r.put("brokers", seen);
                        return r;
                    }
                } catch (Exception notYet) {
                    seen = notYet.toString();
                }
                Thread.sleep(100);
            }
            throw new IllegalStateException(brokers + " brokers with a master not registered in time; "
                + "the nameserver lists " + seen);
        } finally {
            admin.shutdown();
        }
    }

    private List<String> masters(DefaultMQAdminExt admin) throws Exception {
        return admin.examineBrokerClusterInfo().getBrokerAddrTable().values().stream()
            .map(b -> b.getBrokerAddrs().get(0L)).filter(a -> a != null).toList();
    }

    /** The masters the nameserver lists, asked again until one is listed or 60 s pass: a
     * loaded nameserver times out a call now and then, and that is not "no master". */
    private List<String> mastersWithin60s(DefaultMQAdminExt admin) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        String seen = "nothing";
        while (true) {
            try {
                List<String> masters = masters(admin);
                if (!masters.isEmpty()) {
                    return masters;
                }
                seen = "no master";
            } catch (Exception busy) {
                seen = busy.toString();
            }
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("no master registered with " + namesrv
                    + " in 60 s; last answer: " + seen);
            }
            Thread.sleep(100);
        }
    }

    private Map<String, Object> group(String name) throws Exception {
        DefaultMQAdminExt admin = admin();
        try {
            SubscriptionGroupConfig config = new SubscriptionGroupConfig();
            config.setGroupName(name);
            List<String> masters = mastersWithin60s(admin);
            for (String master : masters) {
                admin.createAndUpdateSubscriptionGroupConfig(master, config);
            }
            Map<String, Object> r = new HashMap<>();
            r.put("masters", masters);
            return r;
        } finally {
            admin.shutdown();
        }
    }

    /** TOPIC on every master the nameserver knows, then until its route lists them all. */
    private Map<String, Object> topic(String topic, int queues) throws Exception {
        DefaultMQAdminExt admin = admin();
        try {
            List<String> masters = mastersWithin60s(admin);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            TopicConfig config = new TopicConfig(topic, queues, queues);
            // The gRPC proxy hands out a topic's queues to the message types it accepts.
            config.setAttributes(Map.of("+message.type", "NORMAL"));
            for (String master : masters) {
                while (true) {
                    try {
                        admin.createAndUpdateTopicConfig(master, config);
                        break;
                    } catch (Exception e) {
                        // A busy broker times out an admin call now and then: again, within bounds.
                        if (System.nanoTime() > deadline) {
                            throw e;
                        }
                    }
                }
            }
            while (true) {
                try {
                    TopicRouteData route = admin.examineTopicRouteInfo(topic);
                    long routed = route.getBrokerDatas().stream().map(BrokerData::getBrokerAddrs)
                        .filter(a -> a.containsKey(0L)).count();
                    if (routed == masters.size()) {
                        break;
                    }
                } catch (Exception notYet) {
                    // TOPIC_NOT_EXIST until the master's registration reaches the nameserver.
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException(topic + " not routed in 60 s");
                }
                Thread.sleep(50);
            }
            int attempts = 0;
            String last = "";
            while (true) {
                attempts++;
                try {
                    SendResult sent = producer().send(new Message(topic, WARMUP_TAG, new byte[] {0}));
                    if (sent.getSendStatus() == SendStatus.SEND_OK) {
                        break;
                    }
                    last = sent.getSendStatus().name();
                } catch (Exception e) {
                    last = e.toString();
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("no send to " + topic + " acknowledged in 60 s: " + last);
                }
                Thread.sleep(100);
            }
            Map<String, Object> r = new HashMap<>();
            r.put("masters", masters);
            r.put("attempts", attempts);
            return r;
        } finally {
            admin.shutdown();
        }
    }

    private static Message message(String topic, byte[] body) {
        return new Message(topic, body);
    }

    private static byte[] randomBody(int size) {
        byte[] body = new byte[size];
        ThreadLocalRandom.current().nextBytes(body);
        return body;
    }

    private Map<String, Object> one(String topic, int size, long ns, long max, boolean each) throws Exception {
        DefaultMQProducer p = producer();
        byte[] body = randomBody(size);
        long[] lat = new long[(int) Math.min(max, MAX_SAMPLES)];
        int n = 0;
        long errors = 0;
        long start = System.nanoTime();
        long end = start + ns;
        while (n < lat.length && System.nanoTime() < end) {
            long t = System.nanoTime();
            try {
                SendResult sent = p.send(message(topic, body));
                if (sent.getSendStatus() != SendStatus.SEND_OK) {
                    errors++;
                    continue;
                }
            } catch (Exception e) {
                errors++;
                continue;
            }
            lat[n++] = System.nanoTime() - t;
        }
        Map<String, Object> r = result(n, errors, System.nanoTime() - start, lat, n);
        if (each) {
            r.put("latencies_us", Arrays.stream(lat, 0, n).map(v -> v / 1000).boxed().toList());
        }
        return r;
    }

    private Map<String, Object> many(String topic, int size, long ns, long max, int inFlight) throws Exception {
        DefaultMQProducer p = producer();
        byte[] body = randomBody(size);
        long[] lat = new long[(int) Math.min(max, MAX_SAMPLES)];
        Semaphore window = new Semaphore(inFlight);
        AtomicLong acked = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        int n = 0;
        long start = System.nanoTime();
        long end = start + ns;
        while (n < lat.length && System.nanoTime() < end) {
            window.acquire();
            final int i = n++;
            final long t = System.nanoTime();
            p.send(message(topic, body), callback(window, acked, errors, lat, i, t), SEND_TIMEOUT_MS);
        }
        drain(window, inFlight);
        long elapsed = System.nanoTime() - start;
        return result(acked.get(), errors.get(), elapsed, lat, n);
    }

    private static SendCallback callback(Semaphore window, AtomicLong acked, AtomicLong errors, long[] lat,
                                         int i, long since) {
        return new SendCallback() {
            @Override
            public void onSuccess(SendResult sent) {
                if (sent.getSendStatus() == SendStatus.SEND_OK) {
                    lat[i] = System.nanoTime() - since;
                    acked.incrementAndGet();
                } else {
                    lat[i] = -1;
                    errors.incrementAndGet();
                }
                window.release();
            }

            @Override
            public void onException(Throwable e) {
                lat[i] = -1;
                errors.incrementAndGet();
                window.release();
            }
        };
    }

    private static void drain(Semaphore window, int inFlight) throws InterruptedException {
        if (!window.tryAcquire(inFlight, DRAIN_MS, TimeUnit.MILLISECONDS)) {
            throw new IllegalStateException("sends still unanswered " + DRAIN_MS + " ms after the last");
        }
    }

    /**
     * Offers RATE msgs/s on a 1 ms grid, one asynchronous send per message, at most IN_FLIGHT
     * unanswered (the schedule waits while the broker is behind); each message's latency
     * counts from its due time to its answer.
     */
    private Map<String, Object> rate(String topic, int size, long ns, double rate, int inFlight) throws Exception {
        DefaultMQProducer p = producer();
        byte[] body = randomBody(size);
        long total = (long) (rate * ns / 1e9);
        long[] lat = new long[(int) Math.min(total, MAX_SAMPLES)];
        Semaphore window = new Semaphore(inFlight);
        AtomicLong acked = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        long start = System.nanoTime();
        int n = 0;
        while (n < lat.length) {
            long due = Math.min(lat.length, (long) ((System.nanoTime() - start) * rate / 1e9) + 1);
            while (n < due) {
                window.acquire();
                final int i = n++;
                final long scheduled = start + (long) (i * 1e9 / rate);
                p.send(message(topic, body), callback(window, acked, errors, lat, i, scheduled), SEND_TIMEOUT_MS);
            }
            sleepToNextTick(start);
        }
        long sendNs = System.nanoTime() - start;
        drain(window, inFlight);
        Map<String, Object> r = result(acked.get(), errors.get(), System.nanoTime() - start, lat, n);
        r.put("offered_msgs_s", n / (sendNs / 1e9));
        return r;
    }

    private static void sleepToNextTick(long start) {
        long now = System.nanoTime();
        long next = start + ((now - start) / TICK_NS + 1) * TICK_NS;
        LockSupport.parkNanos(next - now);
    }

    /**
     * RATE msgs/s for WARMUP + SECONDS, consumed back by a push consumer of a fresh group;
     * each body starts with its index, from which the consumer knows when it was due.
     */
    private Map<String, Object> e2e(String topic, int size, long ns, double rate, long warmupNs) throws Exception {
        DefaultMQProducer p = producer();
        int total = (int) Math.min(MAX_SAMPLES, (long) (rate * (ns + warmupNs) / 1e9));
        int warmup = (int) (rate * warmupNs / 1e9);
        long[] lat = new long[total];
        Arrays.fill(lat, -1);
        AtomicLong received = new AtomicLong();
        AtomicLong startAt = new AtomicLong();
        CountDownLatch all = new CountDownLatch(total);
        CountDownLatch assigned = new CountDownLatch(1);
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("bench_e2e_" + topic);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("bench_e2e_" + System.nanoTime());
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            long now = System.nanoTime();
            for (MessageExt m : msgs) {
                if (m.getBody().length < 8) {
                    // The one-byte message that proved the topic writable: the consumer
                    // holds the topic's queues and pulls.
                    assigned.countDown();
                    continue;
                }
                int i = (int) ByteBuffer.wrap(m.getBody()).order(ByteOrder.LITTLE_ENDIAN).getLong();
                if (i >= 0 && i < total && lat[i] < 0) {
                    lat[i] = now - (startAt.get() + (long) (i * 1e9 / rate));
                    received.incrementAndGet();
                    all.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        try {
            // A fresh group gets its queues at its first rebalance, which can come seconds
            // after start(); messages sent before it would wait for it, not for the broker.
            if (!assigned.await(60, TimeUnit.SECONDS)) {
                throw new IllegalStateException("e2e: the consumer of " + topic
                    + " got no queue within 60 s; is the broker registered with the nameserver?");
            }
            Semaphore window = new Semaphore(10_000);
            AtomicLong acked = new AtomicLong();
            AtomicLong errors = new AtomicLong();
            long[] ackLat = new long[total];
            long start = System.nanoTime();
            startAt.set(start);
            int n = 0;
            while (n < total) {
                long due = Math.min(total, (long) ((System.nanoTime() - start) * rate / 1e9) + 1);
                while (n < due) {
                    byte[] body = new byte[Math.max(size, 8)];
                    ByteBuffer.wrap(body).order(ByteOrder.LITTLE_ENDIAN).putLong(n);
                    window.acquire();
                    final int i = n++;
                    p.send(message(topic, body), callback(window, acked, errors, ackLat, i,
                        start + (long) (i * 1e9 / rate)), SEND_TIMEOUT_MS);
                }
                sleepToNextTick(start);
            }
            long sendNs = System.nanoTime() - start;
            all.await(8, TimeUnit.SECONDS);
            long[] measured = Arrays.stream(lat, warmup, total).filter(v -> v >= 0).toArray();
            Map<String, Object> r = result(received.get(), errors.get(), sendNs, measured, measured.length);
            r.put("sent", total);
            r.put("delivered", received.get());
            r.put("offered_msgs_s", total / (sendNs / 1e9));
            return r;
        } finally {
            consumer.shutdown();
        }
    }

    /** One message there and back: what the smoke test asks of a running broker. */
    private Map<String, Object> smoke(String topic) throws Exception {
        DefaultMQProducer p = producer();
        String token = "smoke-" + System.nanoTime();
        SendResult sent = p.send(message(topic, token.getBytes(StandardCharsets.UTF_8)));
        // Every queue assigned from its first offset: no rebalance to wait for.
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer("bench_smoke_" + System.nanoTime());
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.start();
        try {
            consumer.assign(consumer.fetchMessageQueues(topic));
            String got = null;
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (got == null && System.nanoTime() < deadline) {
                for (MessageExt m : consumer.poll(1000)) {
                    if (new String(m.getBody(), StandardCharsets.UTF_8).equals(token)) {
                        got = m.getMsgId();
                    }
                }
            }
            Map<String, Object> r = new HashMap<>();
            r.put("status", sent.getSendStatus().name());
            r.put("sent_id", sent.getMsgId());
            r.put("received_id", got);
            r.put("body", token);
            return r;
        } finally {
            consumer.shutdown();
        }
    }

    private Map<String, Object> master(String controller, String group) throws Exception {
        DefaultMQAdminExt admin = admin();
        try {
            BrokerReplicasInfo.ReplicasInfo info =
                admin.getInSyncStateData(controller, List.of(group)).getReplicasInfoTable().get(group);
            Map<String, Object> r = new HashMap<>();
            String master = info == null ? null : info.getMasterAddress();
            r.put("master", master == null || master.isEmpty() ? null : master);
            r.put("in_sync", info == null ? 0 : info.getInSyncReplicas().size());
            r.put("epoch", info == null ? 0 : info.getMasterEpoch());
            return r;
        } finally {
            admin.shutdown();
        }
    }

    private void event(Map<String, Object> fields) {
        out.println("EVENT " + json(fields));
        out.flush();
    }

    /**
     * One synchronous send at a time at RATE/s, each given TIMEOUT_MS, until stdin has a
     * line (or closes): what the chaos suite's main producer does.
     */
    private Map<String, Object> pacedIds(String topic, String prefix, double rate, long timeoutMs)
            throws Exception {
        DefaultMQProducer p = producer();
        p.setSendMsgTimeout((int) timeoutMs);
        // One try a send within its timeout, as metaq's main producers: an answer or an error.
        p.setRetryTimesWhenSendFailed(0);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        long start = System.nanoTime();
        int sent = 0;
        long acked = 0;
        while (!in.ready()) {
            String id = prefix + "-" + sent++;
            event(Map.of("type", "invoke", "id", id));
            try {
                SendResult answer = p.send(message(topic, id.getBytes(StandardCharsets.UTF_8)), timeoutMs);
                if (answer.getSendStatus() == SendStatus.SEND_OK) {
                    acked++;
                    event(Map.of("type", "ok", "id", id));
                } else {
                    event(Map.of("type", "info", "id", id, "error", answer.getSendStatus().name()));
                }
            } catch (Exception e) {
                event(Map.of("type", "info", "id", id, "error", String.valueOf(e.getMessage())));
            }
            long next = start + (long) (sent * 1e9 / rate);
            long now = System.nanoTime();
            if (next > now) {
                LockSupport.parkNanos(next - now);
            }
        }
        Map<String, Object> r = new HashMap<>();
        r.put("sent", sent);
        r.put("acked", acked);
        return r;
    }

    /**
     * Each queue of TOPIC and the master's end offset of it now. A broker just restarted
     * registers its topics with the nameserver a moment after it says it booted, and a
     * loaded one times out a call now and then: both are asked again for up to 60 s.
     */
    private Map<MessageQueue, Long> endOffsets(DefaultMQAdminExt admin, String topic) throws Exception {
        long routed = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (true) {
            try {
                Map<MessageQueue, Long> ends = new HashMap<>();
                admin.examineTopicStats(topic).getOffsetTable().forEach((q, o) -> ends.put(q, o.getMaxOffset()));
                return ends;
            } catch (org.apache.rocketmq.client.exception.MQClientException
                     | org.apache.rocketmq.remoting.exception.RemotingException e) {
                if (System.nanoTime() > routed) {
                    throw e;
                }
                Thread.sleep(200);
            }
        }
    }

    /** Every queue of TOPIC from its first offset to the master's end offset now. */
    private Map<String, Object> readAll(String topic) throws Exception {
        DefaultMQAdminExt admin = admin();
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer("bench_read_all_" + System.nanoTime());
        consumer.setNamesrvAddr(namesrv);
        consumer.setAutoCommit(false);
        consumer.start();
        try {
            Map<MessageQueue, Long> ends = endOffsets(admin, topic);
            Map<MessageQueue, Long> positions = new HashMap<>();
            consumer.assign(ends.keySet());
            for (MessageQueue q : ends.keySet()) {
                consumer.seekToBegin(q);
                positions.put(q, 0L);
            }
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
            while (System.nanoTime() < deadline
                && ends.entrySet().stream().anyMatch(e -> positions.get(e.getKey()) < e.getValue())) {
                for (MessageExt m : consumer.poll(1000)) {
                    MessageQueue q = new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId());
                    positions.merge(q, m.getQueueOffset() + 1, Math::max);
                    if (WARMUP_TAG.equals(m.getTags())) {
                        continue;  // the message of `topic`, which proved the topic writable
                    }
                    event(Map.of("type", "read", "id", new String(m.getBody(), StandardCharsets.UTF_8),
                        "queue", m.getQueueId(), "offset", m.getQueueOffset()));
                }
            }
            Map<String, Object> behind = new HashMap<>();
            ends.forEach((q, end) -> {
                if (positions.get(q) < end) {
                    behind.put(topic + "/" + q.getQueueId(), end - positions.get(q));
                }
            });
            Map<String, Object> r = new HashMap<>();
            r.put("behind", behind);
            return r;
        } finally {
            consumer.shutdown();
            admin.shutdown();
        }
    }

    /**
     * A backlog drained as its users drain one with this client: the lite pull consumer
     * (prefetching on its own threads), assigned every queue from its first offset, 32
     * messages a pull (the push consumer's default; the lite one asks for 10, and the
     * broker hands out at most 32 from memory and 8 from disk a pull whatever is asked). The CPU is this JVM's while it drains: its start-up
     * and the topic's route look-up come before the clock starts.
     */
    private Map<String, Object> drainBacklog(String topic, String group, long ns) throws Exception {
        DefaultMQAdminExt admin = admin();
        Map<MessageQueue, Long> ends;
        try {
            ends = endOffsets(admin, topic);
        } finally {
            admin.shutdown();
        }
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setPullBatchSize(32);
        consumer.start();
        try {
            consumer.assign(ends.keySet());
            Map<MessageQueue, Long> positions = new HashMap<>();
            long total = 0;
            for (Map.Entry<MessageQueue, Long> e : ends.entrySet()) {
                consumer.seekToBegin(e.getKey());
                positions.put(e.getKey(), 0L);
                total += e.getValue();
            }
            com.sun.management.OperatingSystemMXBean os = (com.sun.management.OperatingSystemMXBean)
                java.lang.management.ManagementFactory.getOperatingSystemMXBean();
            long cpu0 = os.getProcessCpuTime();
            long start = System.nanoTime();
            long deadline = start + ns;
            long count = 0;
            long bytes = 0;
            long last = start;
            long remaining = total;
            while (remaining > 0 && System.nanoTime() < deadline) {
                for (MessageExt m : consumer.poll(1000)) {
                    count++;
                    bytes += m.getBody().length;
                    MessageQueue q = new MessageQueue(m.getTopic(), m.getBrokerName(), m.getQueueId());
                    long before = positions.get(q);
                    long after = Math.min(Math.max(before, m.getQueueOffset() + 1), ends.get(q));
                    positions.put(q, after);
                    remaining -= after - before;
                    last = System.nanoTime();
                }
            }
            long cpu = os.getProcessCpuTime() - cpu0;
            Map<String, Object> r = new HashMap<>();
            r.put("stored", total);
            r.put("count", count);
            r.put("bytes", bytes);
            r.put("behind", remaining);
            r.put("seconds", (last - start) / 1e9);
            r.put("cpu_s", cpu / 1e9);
            return r;
        } finally {
            consumer.shutdown();
        }
    }

    private static Map<String, Object> result(long acked, long errors, long elapsedNs, long[] lat, int n) {
        long[] ok = Arrays.stream(lat, 0, n).filter(v -> v >= 0).toArray();
        Arrays.sort(ok);
        Map<String, Object> r = new HashMap<>();
        r.put("acked", acked);
        r.put("errors", errors);
        r.put("seconds", elapsedNs / 1e9);
        r.put("msgs_s", acked / (elapsedNs / 1e9));
        r.put("p50_ms", percentileMs(ok, 0.5));
        r.put("p99_ms", percentileMs(ok, 0.99));
        r.put("p999_ms", percentileMs(ok, 0.999));
        return r;
    }

    private static Double percentileMs(long[] sorted, double fraction) {
        if (sorted.length == 0) {
            return null;
        }
        return sorted[Math.min(sorted.length - 1, (int) (sorted.length * fraction))] / 1e6;
    }

    private static String json(Object value) {
        if (value == null) {
            return "null";
        }
        if (value instanceof Map<?, ?> map) {
            StringBuilder s = new StringBuilder("{");
            for (Map.Entry<?, ?> e : map.entrySet()) {
                if (s.length() > 1) {
                    s.append(',');
                }
                s.append(json(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
            }
            return s.append('}').toString();
        }
        if (value instanceof List<?> list) {
            StringBuilder s = new StringBuilder("[");
            for (Object o : list) {
                if (s.length() > 1) {
                    s.append(',');
                }
                s.append(json(o));
            }
            return s.append(']').toString();
        }
        if (value instanceof Number || value instanceof Boolean) {
            return value.toString();
        }
        String text = value.toString().replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n");
        return '"' + text + '"';
    }
}
