"""Kafka: which cluster (target), every client built in one place (clients), topic and group
reads and writes (cluster), offsets and lag, config names, what a consumed record always has (consumed), and the
wire protocol queueplane speaks itself."""
