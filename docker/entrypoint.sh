#!/usr/bin/env bash
# Entrypoint of the worker image. The driver Deployment sets its own command (spark-submit);
# executor pods, which Spark creates, start here with the single argument "executor" and
# the SPARK_* environment Spark gives them.
set -euo pipefail

if [[ "${1:-}" != "executor" ]]; then
  exec "$@"
fi

java_opts=()
while IFS='=' read -r name value; do
  [[ "$name" == SPARK_JAVA_OPT_* ]] && java_opts+=("$value")
done < <(env | sort -t_ -k4 -n)

exec "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
  -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
  -cp "${SPARK_HOME}/conf:${SPARK_HOME}/jars/*${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "${SPARK_DRIVER_URL}" \
  --executor-id "${SPARK_EXECUTOR_ID}" \
  --cores "${SPARK_EXECUTOR_CORES}" \
  --app-id "${SPARK_APPLICATION_ID}" \
  --hostname "${SPARK_EXECUTOR_POD_IP}" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
  --podName "${SPARK_EXECUTOR_POD_NAME}"
