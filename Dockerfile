# The queue worker image for clusters with a registry. The local Kubernetes builds the same image
# without one (queueplane/local/kubernetes/images.py): both start from Debian bookworm with the
# packages in docker/debian-packages, install queueplane[worker] with constraints.txt into
# /opt/queueplane/venv, bake Spark's Kafka connector (queueplane/run/spark/spark-kafka-pom.xml) into
# pyspark's jars, and start through docker/entrypoint.sh under tini as uid 185.
# tests/kubernetes/test_worker_image.py holds the two to the same facts.
# Teams add their handler package on top:  FROM <this image>  +  COPY kitchen /opt/queueplane/handlers/kitchen

FROM debian:bookworm-slim AS jars
RUN apt-get update \
 && apt-get install -y --no-install-recommends maven openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY queueplane/run/spark/spark-kafka-pom.xml /build/pom.xml
# The versions' one home is queueplane/run/spark/kafka_input.py (SPARK_VERSION, SCALA_BINARY, TOKEN_PROVIDER_VERSION).
RUN mvn -B -q -f /build/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/jars \
      -Dspark.version=4.2.0 -Dscala.binary=2.13 -Dtoken.provider.version=4.0.0

FROM debian:bookworm-slim
COPY docker/debian-packages /tmp/debian-packages
RUN apt-get update \
 && apt-get install -y --no-install-recommends $(sed 's/#.*//' /tmp/debian-packages) \
 && rm -rf /var/lib/apt/lists/* /tmp/debian-packages
COPY pyproject.toml README.md LICENSE constraints.txt /src/
COPY specs/queue-v1.schema.json /src/specs/
COPY charts /src/charts
COPY queueplane /src/queueplane
COPY spark_apps /src/spark_apps
COPY --from=jars /jars /tmp/connector
RUN python3 -m venv /opt/queueplane/venv \
 && /opt/queueplane/venv/bin/pip install --no-cache-dir -c /src/constraints.txt '/src[worker]' \
 && ln -s /opt/queueplane/venv/lib/python3.11/site-packages/pyspark /opt/spark \
 && /opt/queueplane/venv/bin/python -c "import shutil, pathlib; from queueplane.run.spark.kafka_input import jars_pyspark_lacks; [shutil.copy2(j, '/opt/spark/jars/') for j in jars_pyspark_lacks(pathlib.Path('/tmp/connector'))]" \
 && mkdir -p /opt/queueplane/handlers && cp -r /src/spark_apps /opt/queueplane/spark_apps \
 && rm -rf /src /tmp/connector
COPY docker/entrypoint.sh /opt/entrypoint.sh
RUN echo 'spark:x:185:0:spark:/tmp:/usr/sbin/nologin' >> /etc/passwd
ENV PATH=/opt/queueplane/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    SPARK_HOME=/opt/spark \
    PYSPARK_PYTHON=queueplane-python \
    PYTHONPATH=/opt/queueplane/handlers \
    HOME=/tmp
USER 185
WORKDIR /tmp
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/entrypoint.sh"]
