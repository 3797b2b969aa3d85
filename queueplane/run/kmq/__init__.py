"""The KMQ pattern: start and end markers in a markers topic, and a redelivery tracker that brings
back what was started and never ended; queue semantics on any Kafka version."""
