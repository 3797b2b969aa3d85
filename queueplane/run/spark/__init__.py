"""Spark set-up: the worker's session, the Python daemon and interpreter Spark starts for it,
the planning daemons stopped once idle, and the Kafka connector's pinned jars."""
