"""The embedded local stack: a real Kafka broker on 127.0.0.1 from its Maven Central jars, and the
Maven fetch that brings them."""
