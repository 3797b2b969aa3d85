"""The worker on the Spark driver: the application, each queue's run and its runtime's driver
half, scaling, the Queue status, metrics and health. Nothing here runs in an executor."""
