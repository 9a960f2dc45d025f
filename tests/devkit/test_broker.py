import socket
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer

from devkit.broker import BrokerError, EmbeddedBroker
from ingest.topics import topic_partitions


def test_topic_is_created_with_the_requested_partitions(broker, topic):
    assert topic_partitions(broker.bootstrap_servers, topic) == 4
    assert broker.create_topic(topic, partitions=8) == 4  # existing topic: unchanged


def test_messages_round_trip(broker, topic):
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for i in range(10):
        producer.send(topic, key=b"k", value=str(i).encode())
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap_servers,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    values = [m.value.decode() for m in consumer]
    consumer.close()
    assert values == [str(i) for i in range(10)]


def test_stop_frees_the_port():
    b = EmbeddedBroker().start()
    port = b.port
    b.stop()
    assert not b.running
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_killed_broker_restarts_on_its_port_while_old_connections_linger():
    with EmbeddedBroker() as b:
        b.create_topic("t", partitions=1)
        producer = KafkaProducer(bootstrap_servers=b.bootstrap_servers)
        producer.send("t", b"x").get(timeout=10)
        b.kill()  # the broker closes its side first: those sockets sit in TIME_WAIT on its port
        producer.close()
        b.start()  # tansu rebinds such a port; the free-port check must let it
        assert b.create_topic("t2", partitions=1) == 1


def test_port_in_use_gives_a_clear_error(broker):
    with pytest.raises(BrokerError):
        EmbeddedBroker(port=broker.port).start(timeout_s=2)


def test_zero_partitions_refused(broker):
    with pytest.raises(ValueError, match="partitions"):
        broker.create_topic("x", partitions=0)


def test_a_broker_started_from_a_worker_thread_outlives_that_thread():
    """Linux sends the parent-death signal when the *thread* that forked the child ends: a broker started
    from a thread that then exits (the soak restarts brokers from its fault thread) must keep running."""
    import threading

    broker = EmbeddedBroker()
    starter = threading.Thread(target=broker.start)
    starter.start()
    starter.join()
    try:
        time.sleep(0.5)
        assert broker.running
        broker.create_topic("after-the-thread", partitions=1)
    finally:
        broker.stop()
