"""Chart values that describe the cluster, not the queue: given by whoever deploys, never by a spec.

A spec says what the queue is (its sizes, autoscaling, image). The cluster says where the
worker's Kafka credentials, TLS files and checkpoint volume are, how images are pulled, and
may pin another image for one rollout. Those come from the platform that deploys: `--values
FILE` and `--set key.path=value` on the command line (helm's flags, in helm's order: files, then
sets); in Airflow, the Variable ``queueplane_cluster_values`` (JSON, every release) and nothing
else: whoever may trigger a queue's DAG chooses only what the trigger form offers. The spec's own
values are refused here, so a deployer cannot resize or rename a team's queue behind its spec,
and so is any Spark setting that would switch off RPC authentication or encryption, mount a host
path or name credentials (queueplane.deploy.spark_conf), whoever gives it. The pods' extension
points (driverPod, executorPod) are refused the same things: a volume other than the kinds Pod
Security ``restricted`` admits (so never a host path), a variable the chart or Spark sets, and a
literal value under a credential's name. The chart's values schema and templates refuse the same.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from queueplane.deploy.spark_conf import CREDENTIAL_NAME, check_conf
from queueplane.errors import UsageError

AIRFLOW_VARIABLE = "queueplane_cluster_values"
SPEC_OWNED = ("application", "queues", "driver", "executor", "autoscaling")
POD_EXTENSIONS = ("driverPod", "executorPod")
# The volume kinds Pod Security "restricted" admits (charts/queue-worker/templates/_helpers.tpl).
VOLUME_KINDS = (
    "emptyDir",
    "configMap",
    "secret",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
)
# Variables the chart or Spark sets, and the JVM's option variables: a second entry would win.
REFUSED_ENV = re.compile(
    r"^(queueplane_|_?spark_|pyspark_|java_tool_options$|jdk_java_options$|_java_options$|pod_name$|home$|pythonpath$)",
    re.IGNORECASE,
)


def merge_values(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, mappings merged key by key, anything else replaced."""
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def checked(values: Any, source: str) -> dict[str, Any]:
    """Cluster values from ``source`` (named in the error), or UsageError saying what is wrong."""
    if values in (None, ""):
        return {}
    if not isinstance(values, dict):
        raise UsageError(f"{source}: cluster values must be a mapping of chart values, got {type(values).__name__}")
    owned = [key for key in SPEC_OWNED if key in values]
    if owned:
        raise UsageError(
            f"{source}: /{owned[0]} comes from the queue's spec and cannot be set by the deployer "
            "(cluster values may set kafka, checkpoint, image, imagePullSecrets, cpuRequests, metrics, spark, "
            "sparkAuth, pod placement and the pods' extension points driverPod and executorPod)"
        )
    spark = values.get("spark") or {}
    settings = (spark.get("conf") or {}) if isinstance(spark, dict) else {}
    if not isinstance(settings, dict):
        raise UsageError(f"{source}: /spark/conf must be a mapping of Spark settings, got {type(settings).__name__}")
    credentials = [key for key in settings if isinstance(key, str) and CREDENTIAL_NAME.search(key)]
    if credentials:
        raise UsageError(
            f"{source}: /spark/conf/{credentials[0]}: credentials never go into chart values (helm keeps values "
            "readable in the release); put them in a Secret (kafka.configSecret, kafka.tlsSecret)"
        )
    check_conf(settings, f"{source}: /spark/conf")
    for role in POD_EXTENSIONS:
        _check_pod_extensions(values.get(role), f"{source}: /{role}")
    return values


def _check_pod_extensions(pod: Any, where: str) -> None:
    """UsageError naming the first refused volume or variable of driverPod or executorPod."""
    if not isinstance(pod, dict):
        return
    for number, volume in enumerate(pod.get("extraVolumes") or []):
        kinds = [key for key in volume if key != "name"] if isinstance(volume, dict) else []
        refused = [key for key in kinds if key not in VOLUME_KINDS]
        if refused:
            why = "a worker never mounts a host path" if refused[0] == "hostPath" else "not a kind the platform admits"
            raise UsageError(
                f"{where}/extraVolumes/{number}/{refused[0]}: refused: {why}. A worker's volumes are of the kinds "
                f"Pod Security restricted admits: {', '.join(VOLUME_KINDS)}"
            )
    for number, variable in enumerate(pod.get("extraEnv") or []):
        name = str(variable.get("name", "")) if isinstance(variable, dict) else ""
        if REFUSED_ENV.search(name):
            raise UsageError(
                f"{where}/extraEnv/{number}/name: {name} is refused: the chart's, Spark's and the JVM's own "
                "variables (QUEUEPLANE_*, SPARK_*, _SPARK_*, PYSPARK_*, POD_NAME, HOME, PYTHONPATH, the JVM's options) "
                "are the platform's and no value may change them"
            )
        if CREDENTIAL_NAME.search(name) and "value" in variable:
            raise UsageError(
                f"{where}/extraEnv/{number}/value: {name} looks like a credential, and credentials never go into "
                "chart values (helm keeps values readable in the release); refer to a Secret with "
                "valueFrom.secretKeyRef"
            )


def from_files(paths: list[str]) -> dict[str, Any]:
    """`--values FILE` ... merged in order, each checked."""
    merged: dict[str, Any] = {}
    for path in paths:
        try:
            document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"--values {path}: cannot read the file: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise UsageError(f"--values {path}: not YAML: {str(exc).splitlines()[0]}") from None
        merged = merge_values(merged, checked(document, path))
    return merged


def from_sets(assignments: list[str]) -> dict[str, Any]:
    """`--set a.b=value` ... as helm reads them: dotted paths (``\\.`` for a literal dot), later wins.

    A value is read as a YAML scalar (``3`` a number, ``true`` a boolean, ``null`` nothing);
    anything else stays text. Lists and maps belong in a ``--values`` file.
    """
    merged: dict[str, Any] = {}
    for assignment in assignments:
        path, sep, text = assignment.partition("=")
        keys = [k.replace("\0", ".") for k in path.replace("\\.", "\0").split(".")]
        if not sep or not all(keys):
            raise UsageError(f"--set {assignment}: expected key.path=value, e.g. image.tag=1.2.3")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        if isinstance(value, (dict, list)):
            value = text
        for key in reversed(keys):
            value = {key: value}
        merged = merge_values(merged, checked(value, f"--set {assignment}"))
    return merged


def from_flags(files: list[str], sets: list[str]) -> dict[str, Any]:
    """The command line's cluster values: ``--values`` files in order, then every ``--set`` on top."""
    return merge_values(from_files(files), from_sets(sets))
