"""Spark's Kafka input in one place: the connector's pinned jars, the source the consumer and kmq
runtimes read with, where a query without a checkpoint starts, and the records a task gets.

Spark's Kafka source and sink (spark-sql-kafka-0-10) are not part of pyspark; they come
from Maven Central through the same Maven fetch as the local broker's jars, cached under
queueplane's download cache, so only the first run on a machine goes to the network.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from queueplane.errors import QueueplaneError
from queueplane.handler_api import Record
from queueplane.kafka import names as kn
from queueplane.kafka.offsets import committed_offsets
from queueplane.kafka.target import KafkaTarget, java_client_settings
from queueplane.local.maven import copy_dependencies
from queueplane.paths import cache_dir
from queueplane.spec.model import QueueSpec

if TYPE_CHECKING:
    import pyarrow as pa

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
# Columns the driver selects from Spark's Kafka source before handing batches to the tasks.
# A record without headers comes as a null list, and Spark's Arrow writer measures each batch's
# bytes after every row: with null lists that measure walks the whole batch so far (about 11
# core-us a record at 10,000 rows a batch, docs/design/consumer-throughput.md). An empty list
# costs what any other column does.
INPUT_COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "unix_millis(timestamp) AS ts",
    "coalesce(headers, array()) AS headers",
)
EARLIEST, LATEST = -2, -1  # Spark's startingOffsets JSON spelling


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
    return [str(p) for p in jars_pyspark_lacks(folder)]


def jars_pyspark_lacks(folder: Path) -> list[Path]:
    """The jars in ``folder`` whose artifacts pyspark does not ship.

    Maven's nearest-wins picks older copies of libraries pyspark ships (Scala, slf4j, lz4,
    snappy); pyspark's own must win, so only artifacts it lacks are added. The worker images
    (the Dockerfile's and the local one) bake in exactly this set.
    """
    present = {_artifact(p.name) for p in pyspark_jars().glob("*.jar")}
    return sorted(p for p in folder.glob("*.jar") if _artifact(p.name) not in present)


def _artifact(jar_name: str) -> str:
    return re.sub(r"-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$", "", jar_name)


def pyspark_jars() -> Path:
    """The jars Spark runs with: SPARK_HOME's when it is set, else those of the pip package.

    SPARK_HOME first, because spark-submit puts ``$SPARK_HOME/python/lib/pyspark.zip`` on the
    driver's path: pyspark is then imported from the zip, and no jars sit beside its file.
    """
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def connector_in_pyspark() -> bool:
    """Whether the connector is baked into pyspark's own jars (the worker image), so nothing is fetched."""
    return any(pyspark_jars().glob(f"spark-sql-kafka-0-10_{SCALA_BINARY}-{SPARK_VERSION}.jar"))


def with_kafka_connector(builder: Any) -> Any:
    """A SparkSession builder with Spark's built-in Kafka source and sink on its classpath."""
    if connector_in_pyspark():
        return builder
    return builder.config("spark.jars", ",".join(connector_jars()))


def kafka_options(target: KafkaTarget) -> dict[str, str]:
    """The cluster's client settings as Spark's Kafka source and sink options (``kafka.`` prefixed)."""
    return {f"kafka.{key}": value for key, value in java_client_settings(target.settings).items()}


def kafka_source(spark: Any, target: KafkaTarget, topic: str, group_id: str) -> Any:
    """A streaming reader of ``topic``: the consumer, kmq and tracker queries all start here.

    Retention may delete records a stopped worker never saw; the queue carries on rather
    than stop (``failOnDataLoss`` off). Read committed: records of an aborted transaction (an
    exactly-once worker's, or a redrive killed midway) are never handled.
    """
    return (
        spark.readStream.format("kafka")
        .options(**kafka_options(target))
        .option("subscribe", topic)
        # Its consumer groups under the queue's own prefix, which the worker's ACLs grant.
        .option("groupIdPrefix", kn.spark_reader_group_prefix(group_id))
        .option("failOnDataLoss", "false")
        .option("kafka.isolation.level", "read_committed")
    )


def starting_offsets(target: KafkaTarget, queue: QueueSpec) -> str:
    """Where a query without a checkpoint starts: the group's committed offsets, else ``startFrom``."""
    committed = committed_offsets(target, queue.group.id, queue.topic.name, queue.topic.partitions)
    fallback = EARLIEST if queue.group.start_from == "earliest" else LATEST
    per_partition = {
        str(p): committed.get(p) if committed.get(p) is not None else fallback for p in range(queue.topic.partitions)
    }
    return json.dumps({queue.topic.name: per_partition})


def input_records(
    batch: pa.RecordBatch, delivery_count: Callable[[tuple[tuple[str, bytes | None], ...]], int] | None = None
) -> list[Record]:
    """An Arrow batch of INPUT_COLUMNS as records; ``delivery_count`` reads it from the headers (kmq), else 1."""
    column = batch.column
    raw_headers = column("headers")
    if len(raw_headers.flatten()) == 0:  # no record of the batch has headers: skip converting them
        headers: Iterable[tuple[tuple[str, bytes | None], ...]] = repeat((), batch.num_rows)
    else:
        headers = [tuple((h["key"], h["value"]) for h in raw) if raw else () for raw in raw_headers.to_pylist()]
    if delivery_count is None:
        counts: Iterable[int] = repeat(1, batch.num_rows)
    else:
        headers = list(headers)
        counts = [delivery_count(h) for h in headers]
    return list(
        map(
            Record.make,
            column("key").to_pylist(),
            column("value").to_pylist(),
            headers,
            column("topic").to_pylist(),
            column("partition").to_pylist(),
            column("offset").to_pylist(),
            counts,
            column("ts").to_pylist(),
        )
    )
