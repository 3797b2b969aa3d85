# The queue worker image: Python 3.11, Java 17, Spark 4.2.0 (from pyspark, pinned in constraints.txt), the
# Kafka connector jars, and queueplane[worker]. charts/queue-worker runs
#   /opt/spark/bin/spark-submit ... /opt/queueplane/spark_apps/queue_worker.py --spec ...
# in it, the same command tests/integration/test_chart_contract.py runs locally.
# Teams add their handler package on top:  FROM <this image>  +  COPY kitchen /opt/queueplane/handlers/kitchen

FROM maven:3.9.9-eclipse-temurin-17 AS jars
COPY docker/kafka-connector-pom.xml /build/pom.xml
# Only what Spark does not ship already: the connector, its token provider, the Kafka client, commons-pool2.
RUN mvn -q -f /build/pom.xml dependency:copy-dependencies -DoutputDirectory=/jars \
      -DincludeArtifactIds=spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2

FROM python:3.11.14-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
COPY pyproject.toml README.md LICENSE constraints.txt /src/
COPY specs/queue-v1.schema.json /src/specs/
COPY charts /src/charts
COPY queueplane /src/queueplane
RUN pip install --no-cache-dir -c /src/constraints.txt '/src[worker]' && rm -rf /src \
 && ln -s "$(python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')" /opt/spark
COPY --from=jars /jars/ /opt/spark/jars/
COPY spark_apps /opt/queueplane/spark_apps
COPY docker/entrypoint.sh /opt/entrypoint.sh
RUN useradd --uid 185 --gid 0 --home-dir /tmp --no-create-home spark \
 && mkdir -p /opt/queueplane/handlers
ENV SPARK_HOME=/opt/spark \
    PYSPARK_PYTHON=python3 \
    PYTHONPATH=/opt/queueplane/handlers \
    HOME=/tmp
USER 185
WORKDIR /tmp
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/entrypoint.sh"]
