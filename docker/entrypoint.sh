#!/usr/bin/env bash
# Entrypoint of the worker image, as apache/spark-docker's: `driver ARGS` runs spark-submit in
# client mode, `executor` (the argument Spark's Kubernetes backend gives the pods it creates)
# runs the executor backend with the SPARK_* environment Spark sets, anything else is run as is.
set -euo pipefail

# The JRE's home as installed (Debian's path moves with the package's version and architecture).
if [[ -z "${JAVA_HOME:-}" ]]; then
  JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
  export JAVA_HOME
fi
SPARK_HOME="${SPARK_HOME:-/opt/spark}"

case "${1:-}" in
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" --deploy-mode client \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" "$@"
    ;;
  executor)
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
    ;;
  *)
    exec "$@"
    ;;
esac
