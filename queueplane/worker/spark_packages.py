"""Spark's Kafka connector in one place: its pinned jars, and the source the runtimes read with.

Spark's Kafka source and sink (spark-sql-kafka-0-10) are not part of pyspark; they come
from Maven Central through the same Maven fetch as the local broker's jars, cached under
queueplane's download cache, so only the first run on a machine goes to the network.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from queueplane.connection import KafkaTarget, java_client_settings
from queueplane.errors import QueueplaneError
from queueplane.maven import copy_dependencies
from queueplane.paths import cache_dir

SPARK_VERSION = "4.2.0"  # the pyspark pin in pyproject.toml; the connector must match it exactly
SCALA_BINARY = "2.13"
# The connector depends on spark-token-provider-kafka of its own version, which Maven Central
# does not serve for 4.2.0 (its metadata ends at 4.1.0-preview1; 4.0.0 is the newest release
# there). The connector calls five methods of it (KafkaConfigUpdater.set/setIfUnset/
# setAuthenticationConfigIfNeeded/build, KafkaTokenUtil, KafkaRedactionUtil), each with the
# same signature in 4.0.0, so that release stands in, pinned.
TOKEN_PROVIDER_VERSION = "4.0.0"
SPARK_SQL_KAFKA = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{SPARK_VERSION}"
POM = Path(__file__).with_name("spark-kafka-pom.xml")


class ConnectorUnavailable(QueueplaneError):
    """Spark's Kafka connector could not be fetched."""


def connector_jars() -> list[str]:
    """Paths of the connector's jars (and its runtime dependencies), fetched on first use."""
    target = cache_dir() / f"spark-sql-kafka-{SPARK_VERSION}" / "jars"
    props = {
        "spark.version": SPARK_VERSION,
        "scala.binary": SCALA_BINARY,
        "token.provider.version": TOKEN_PROVIDER_VERSION,
    }
    folder = copy_dependencies(POM, target, props, f"Spark's Kafka connector {SPARK_VERSION}", ConnectorUnavailable)
    # Maven's nearest-wins picks older copies of libraries pyspark ships (Scala, slf4j, lz4,
    # snappy); pyspark's own must win, so only artifacts it lacks are added.
    present = {_artifact(p.name) for p in _pyspark_jars().glob("*.jar")}
    return sorted(str(p) for p in folder.glob("*.jar") if _artifact(p.name) not in present)


def _artifact(jar_name: str) -> str:
    return re.sub(r"-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$", "", jar_name)


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def with_kafka_connector(builder: Any) -> Any:
    """A SparkSession builder with Spark's built-in Kafka source and sink on its classpath."""
    return builder.config("spark.jars", ",".join(connector_jars()))


def kafka_options(target: KafkaTarget) -> dict[str, str]:
    """The cluster's client settings as Spark's Kafka source and sink options (``kafka.`` prefixed)."""
    return {f"kafka.{key}": value for key, value in java_client_settings(target.settings).items()}


def kafka_source(spark: Any, target: KafkaTarget, topic: str) -> Any:
    """A streaming reader of ``topic``: the consumer, kmq and tracker queries all start here.

    Retention may delete records a stopped worker never saw; the queue carries on rather
    than stop (``failOnDataLoss`` off).
    """
    return (
        spark.readStream.format("kafka")
        .options(**kafka_options(target))
        .option("subscribe", topic)
        .option("failOnDataLoss", "false")
    )
