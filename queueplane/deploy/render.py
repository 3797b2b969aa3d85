"""A worker application (one or more queue specs) as a Helm release of charts/queue-worker:
values, manifests, and their checks.

`helm_values` is the one mapping from specs to the chart's values; every face (the CLI's
`render`, the Airflow deploy operator, the tests) goes through it and through `render`,
which runs the real `helm template` and validates what comes out.

A render needs no cluster and gives the same manifests every time for the same specs and
values: the Secret of Spark's RPC authentication is named (``sparkAuth.existingSecret``, made
once by the deploy: queueplane.deploy.spark_auth), not made by the chart with helm's ``lookup``,
which a render without a cluster (``helm template``, Argo CD) cannot do and would answer with a
new secret each time. The cluster's API versions are what the caller says (``api_versions``):
the Prometheus Operator's kinds render only when named, and ``Rendered.left_out`` says so when
they are not.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from queueplane.deploy.cluster_values import merge_values
from queueplane.deploy.helm import run_helm
from queueplane.deploy.kube_schema import KUBERNETES_VERSION, CustomKinds, custom_kinds, object_problems
from queueplane.deploy.monitoring_schema import API_VERSIONS, monitoring_crds
from queueplane.deploy.policy import policy_problems
from queueplane.errors import Problem, QueueplaneError, SpecInvalid, UsageError
from queueplane.paths import shipped_file
from queueplane.spec.files import parse_text
from queueplane.spec.model import QueueSpec, memory_mi
from queueplane.spec.schema import load_schema

CHART_NAME = "queue-worker"
EXECUTOR_TEMPLATE_KEY = "executor-pod-template.yaml"
# PySpark on Kubernetes: Python workers live outside the JVM heap, so Spark's default for
# non-JVM jobs reserves 40% of the heap (at least 384 MiB) on top of it.
MEMORY_OVERHEAD_FACTOR = 0.4
MIN_MEMORY_OVERHEAD_MI = 384
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ManifestInvalid(QueueplaneError):
    """Rendered objects fail the Kubernetes schema or the platform policy."""


@dataclass
class Rendered:
    release: str
    namespace: str
    chart: Path
    values: dict
    values_file: Path
    manifests: str
    objects: list[dict]
    # Kinds the values ask for that the chart left out: the cluster named does not serve them.
    left_out: list[str] = field(default_factory=list)


def chart_path() -> Path:
    """The chart: charts/ in a checkout, else the wheel's copy."""
    return shipped_file(f"charts/{CHART_NAME}")


def _schema_pattern(*path: str) -> re.Pattern[str]:
    node: Any = load_schema()
    for part in path:
        node = node[part]
    return re.compile(node["pattern"])


def _checked(queue: QueueSpec, pointer: str, value: str, pattern: re.Pattern[str]) -> str:
    """A spec string that lands in a manifest: it must match its schema pattern, on one line.

    Specs are schema-validated before they get here; this check is the chart's own guard, so
    that no QueueSpec, however it was built, can carry YAML or template syntax into a manifest.
    """
    if _CONTROL.search(value) or not pattern.fullmatch(value) or "{{" in value:
        raise SpecInvalid([Problem(queue.source, pointer, f"{value!r} is not allowed in a Kubernetes manifest")])
    return value


def _memory_mi(queue: QueueSpec, pointer: str, text: str) -> int:
    _checked(queue, pointer, text, _schema_pattern("$defs", "podResources", "properties", "memory"))
    return memory_mi(text)


def _pod(queue: QueueSpec, role: str, resources: dict[str, Any]) -> dict[str, int]:
    memory = _memory_mi(queue, f"/spec/deployment/{role}/memory", resources.get("memory", "1g"))
    return {
        "cores": int(resources.get("cores", 1)),
        "memoryMi": memory,
        "memoryOverheadMi": max(MIN_MEMORY_OVERHEAD_MI, math.ceil(memory * MEMORY_OVERHEAD_FACTOR)),
    }


@cache
def chart_defaults() -> dict:
    """The chart's values.yaml: what helm takes for every value a release does not set."""
    defaults: dict = yaml.safe_load((chart_path() / "values.yaml").read_text(encoding="utf-8"))
    return defaults


def default_image() -> str:
    """The chart's own image (values.yaml), for specs that name none: the chart is the one place for it."""
    image = chart_defaults()["image"]
    return f"{image['repository']}:{image['tag']}"


def _image(queue: QueueSpec) -> dict[str, str]:
    reference = queue.image or default_image()
    pattern = _schema_pattern("properties", "spec", "properties", "deployment", "properties", "image")
    _checked(queue, "/spec/deployment/image", reference, pattern)
    name, _, digest = reference.partition("@")
    repository, tag = name, ""
    if ":" in name.rsplit("/", 1)[-1]:
        repository, tag = name.rsplit(":", 1)
    if not digest and tag in ("", "latest"):
        raise SpecInvalid(
            [Problem(queue.source, "/spec/deployment/image", f"{reference!r} is not pinned: give a tag or a digest")]
        )
    return {"repository": repository, "tag": tag, "digest": digest, "pullPolicy": "IfNotPresent"}


def _spec_text(queue: QueueSpec) -> str:
    """The spec file as the team wrote it: the worker validates it again, so defaults stay implicit."""
    try:
        return Path(queue.source).read_text(encoding="utf-8")
    except OSError as exc:
        raise QueueplaneError(f"{queue.source}: cannot read the spec to mount it: {exc.strerror}") from None


def spec_json(queue: QueueSpec, text: str) -> str:
    """The file's ``spec`` as one line of JSON: what the chart writes as the Queue object's spec.

    JSON, and not the YAML helm would parse (into float64 numbers, by its own YAML rules): the
    object holds exactly the values the spec check read, as the file wrote them (no defaults).
    """
    parsed = parse_text(text, queue.source)
    if parsed.problems or not isinstance(parsed.data, dict) or not isinstance(parsed.data.get("spec"), dict):
        raise SpecInvalid([Problem(queue.source, "/spec", "changed since it was checked; validate it again")])
    return json.dumps(parsed.data["spec"], sort_keys=True, ensure_ascii=True)


def _queue_values(queue: QueueSpec, label: re.Pattern[str]) -> dict[str, Any]:
    text = _spec_text(queue)
    return {
        "name": _checked(queue, "/metadata/name", queue.name, label),
        "groupType": queue.group.type,
        "topic": queue.topic.name,
        "deadLetterTopic": queue.dead_letter.name,
        "targetLagSeconds": queue.target_lag_seconds,
        "spec": text,
        "specJson": spec_json(queue, text),
    }


def helm_values(queues: Sequence[QueueSpec]) -> dict:
    """The chart values the specs of one application determine (the chart's values.yaml supplies the rest).

    The specs agree on what they share (``rules.application_problems``), so the first one
    gives the image and the pod shapes; the executor pool's bounds are the sums of theirs.
    """
    first = queues[0]
    label = _schema_pattern("$defs", "dnsLabel")
    return {
        "application": {
            "name": _checked(first, "/spec/deployment/application", first.application, label),
            "team": _checked(first, "/metadata/team", first.team, label),
        },
        "queues": [_queue_values(queue, label) for queue in queues],
        "image": _image(first),
        "driver": _pod(first, "driver", first.driver),
        "executor": _pod(first, "executor", first.executor),
        "autoscaling": {
            "minExecutors": sum(queue.min_executors for queue in queues),
            "maxExecutors": sum(queue.max_executors for queue in queues),
        },
    }


def application_queues(queues: Sequence[QueueSpec]) -> list[QueueSpec]:
    """The queues of one application, or UsageError: a release is one application's, whole."""
    if not queues:
        raise UsageError("no queue to render")
    names = sorted({queue.application for queue in queues})
    if len(names) > 1:
        raise UsageError(
            f"{queues[0].source}: the specs belong to {len(names)} worker applications ({', '.join(names)}); "
            "a release is one application: render or deploy each application's specs on their own"
        )
    return list(queues)


def spark_auth_secret(release: str) -> str:
    """The Secret of Spark's RPC authentication a render names unless the cluster values name another."""
    return f"{release}-spark-auth"


def render(
    queues: QueueSpec | Sequence[QueueSpec],
    *,
    output_dir: Path | None = None,
    overrides: dict | None = None,
    api_versions: Sequence[str] = (),
) -> Rendered:
    """`helm template` of an application's release (its queues' specs), validated; files go to
    output_dir (else a temporary folder).

    ``overrides`` are cluster values the specs do not hold (kafka secrets, checkpoint claim),
    merged over the specs' values. ``api_versions`` are what the target cluster serves beyond
    Kubernetes' own (helm's ``--api-versions``, e.g. ``monitoring.coreos.com/v1/PodMonitor``).
    """
    queues = application_queues([queues] if isinstance(queues, QueueSpec) else queues)
    queue = queues[0]
    if queue.deploy_target != "kubernetes":
        raise UsageError(
            f"{queue.source}: /spec/deployment/target is {queue.deploy_target}: the Helm chart is for target "
            "kubernetes; a spark-submit queue is deployed by its Airflow DAG (docs/airflow.md)"
        )
    namespace = _checked(queue, "/spec/deployment/namespace", queue.namespace, _schema_pattern("$defs", "dnsLabel"))
    values = helm_values(queues)
    values["sparkAuth"] = {"existingSecret": spark_auth_secret(values["application"]["name"])}
    values = merge_values(values, overrides or {})
    release = values["application"]["name"]
    folder = Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp(prefix=f"queueplane-{release}-"))
    folder.mkdir(parents=True, exist_ok=True)
    values_file = folder / "values.yaml"
    values_file.write_text(yaml.safe_dump(values, sort_keys=False, allow_unicode=True), encoding="utf-8")
    chart = chart_path()
    result = run_helm(
        [
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--values",
            str(values_file),
            "--kube-version",
            KUBERNETES_VERSION,
            *(arg for version in api_versions for arg in ("--api-versions", version)),
        ]
    )
    manifests = result.stdout
    objects = [obj for obj in yaml.safe_load_all(manifests) if obj]
    validate_manifests(objects)
    (folder / "manifests.yaml").write_text(manifests, encoding="utf-8")
    return Rendered(
        release, namespace, chart, values, values_file, manifests, objects, monitoring_left_out(values, objects)
    )


def monitoring_left_out(values: dict, objects: list[dict]) -> list[str]:
    """The Prometheus Operator's kinds the values turn on and the render left out (the cluster
    named does not serve them), in the chart's order."""
    monitoring = merge_values(chart_defaults(), values)["monitoring"]
    wanted = {
        "PodMonitor": monitoring["podMonitor"]["enabled"],
        "PrometheusRule": monitoring["prometheusRule"]["enabled"],
    }
    made = {obj.get("kind") for obj in objects}
    return [kind for kind, on in wanted.items() if on and kind not in made]


def left_out_note(kinds: Sequence[str]) -> str:
    """One line saying which monitoring objects a render left out, and how to get them or say none."""
    flags = " ".join(f"--api-versions {API_VERSIONS[kind]}" for kind in kinds)
    switches = " and ".join(f"monitoring.{kind[0].lower() + kind[1:]}.enabled=false" for kind in kinds)
    return (
        f"note: {' and '.join(kinds)} left out: the chart renders them only for a cluster that serves their kinds; "
        f"pass {flags} for one that does, or set {switches} to want none"
    )


def chart_cluster_objects() -> list[dict]:
    """The chart's cluster-wide objects, which the deploy creates or updates before the release
    (deploy/definitions.py): crds/ (the Queue CustomResourceDefinition, which Helm also installs
    with a first release) and cluster/ (the Queue admission policy: Helm takes only CRDs from
    crds/, and a release's templates must not hold one cluster-wide policy many releases share)."""
    return [
        doc
        for folder in ("crds", "cluster")
        for path in sorted((chart_path() / folder).glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]


def chart_crds() -> list[dict]:
    """The CustomResourceDefinitions among them."""
    return [doc for doc in chart_cluster_objects() if doc.get("kind") == "CustomResourceDefinition"]


@cache
def chart_kinds() -> CustomKinds:
    """The kinds beyond Kubernetes' own a release may hold: the chart's Queue and the Prometheus Operator's."""
    return custom_kinds([*chart_crds(), *monitoring_crds()])


def executor_pod_templates(objects: list[dict]) -> list[dict]:
    """The executor pod templates the chart hands to Spark inside its ConfigMaps."""
    return [
        yaml.safe_load(obj["data"][EXECUTOR_TEMPLATE_KEY])
        for obj in objects
        if obj.get("kind") == "ConfigMap" and EXECUTOR_TEMPLATE_KEY in (obj.get("data") or {})
    ]


def validate_manifests(objects: list[dict]) -> None:
    """Every object (and executor pod template) against the pinned Kubernetes API, strictly, then the policy."""
    templates = executor_pod_templates(objects)
    custom = chart_kinds()
    problems = [problem for obj in [*objects, *templates] for problem in object_problems(obj, custom)]
    problems += policy_problems(objects, templates)
    if problems:
        listing = "; ".join(problems)
        raise ManifestInvalid(
            f"{len(problems)} problem(s) in the rendered manifests (Kubernetes {KUBERNETES_VERSION}): {listing}"
        )
