"""Run: the PySpark worker of a queue. One folder per group type (share/, consumer/, kmq/) behind
the QueueRuntime interface (runtime.py); beside them what they share: the driver, the Spark
session and daemon, Kafka input, outcome rows, settings, metrics, scaling, and the handler contract.

Nothing here imports pyspark or pyarrow at package import: handlers import queueplane.run.handler
inside executors."""
