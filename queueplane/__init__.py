"""queueplane: Kafka queues from a YAML spec.

The top-level package stays light: importing it must not pull in Kafka, Spark or
Airflow, because handlers import ``Retry`` and ``Reject`` from here inside executors. The
handler contract is in queueplane.handler_api.
"""

from queueplane.handler_api import Output, Record, Reject, Retry

__version__ = "0.1.0"
__all__ = ["Output", "Record", "Reject", "Retry", "__version__"]
