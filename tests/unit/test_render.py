"""The chart through the real helm: lint, render every example, strict Kubernetes schemas, policy, injection."""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import shlex
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLE_SPECS, EXAMPLES, run_cli

from queueplane.deploy import cluster_values
from queueplane.deploy.helm import HelmError, run_helm
from queueplane.deploy.policy import DRIVER_RBAC
from queueplane.deploy.render import ManifestInvalid, chart_path, executor_pod_templates, render, validate_manifests
from queueplane.errors import QueueplaneError, SpecInvalid, UsageError
from queueplane.provision import steps

SPECS = EXAMPLE_SPECS


def _queue(path=EXAMPLES / "cafe" / "coffee-orders.yaml"):
    return steps.validate([str(path)], None)[0]


@pytest.fixture(scope="module")
def coffee():
    return render(_queue())


def _find(objects, kind):
    return next(o for o in objects if o["kind"] == kind)


def _submit_args(driver: dict) -> list[str]:
    """The spark-submit options pyspark starts the driver's JVM with, split as pyspark splits them."""
    env = {e["name"]: e.get("value") for e in driver["env"]}
    words = shlex.split(env["PYSPARK_SUBMIT_ARGS"])
    assert words[-1] == "pyspark-shell"
    return words[:-1]


def test_helm_lint_passes_on_the_chart_and_with_every_example(tmp_path):
    run_helm(["lint", str(chart_path()), "--strict"])
    for spec in SPECS:
        rendered = render(_queue(spec), output_dir=tmp_path / spec.stem)
        run_helm(["lint", str(chart_path()), "--strict", "--values", str(rendered.values_file)])


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_example_renders_to_valid_labelled_objects(spec, tmp_path):
    queue = _queue(spec)
    rendered = render(queue, output_dir=tmp_path)
    assert (tmp_path / "manifests.yaml").read_text() == rendered.manifests
    kinds = sorted(o["kind"] for o in rendered.objects)
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "NetworkPolicy",
        "Pod",  # helm test's
        "Queue",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ], "no Secret: Spark's is named (sparkAuth.existingSecret) and made once by the deploy"
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert labels["queueplane.io/team"] == queue.team and labels["queueplane.io/application"] == queue.name
        assert labels["app.kubernetes.io/instance"] == queue.name and "app.kubernetes.io/managed-by" in labels
        assert obj["metadata"]["namespace"] == queue.namespace
    deployment = _find(rendered.objects, "Deployment")
    # Two drivers side by side during a rollout suit share groups only.
    strategy = "RollingUpdate" if queue.group.type == "share" else "Recreate"
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == strategy
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    driver = pod["spec"]["containers"][0]
    assert driver["command"] == ["/usr/bin/tini", "--", "python3"], "SIGTERM reaches the worker, not the JVM"
    assert driver["args"][0] == "/opt/queueplane/spark_apps/queue_worker.py"
    args = _submit_args(driver)
    assert args[args.index("--master") + 1] == "k8s://https://kubernetes.default.svc"
    assert args[args.index("--deploy-mode") + 1] == "client"
    assert f"spark.executor.cores={queue.executor['cores']}" in args
    assert f"spark.executor.instances={queue.min_executors}" in args
    assert driver["readinessProbe"]["httpGet"]["port"] == "metrics" == driver["livenessProbe"]["httpGet"]["port"]
    service = _find(rendered.objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert f"spark.driver.host={service['metadata']['name']}.{queue.namespace}.svc" in args
    spec_text = _find(rendered.objects, "ConfigMap")["data"][f"{queue.name}.yaml"]
    assert spec_text == spec.read_text(), "the spec file is mounted as written"
    assert driver["args"][1:3] == ["--spec", f"/etc/queueplane/spec/{queue.name}.yaml"]


def test_checkpoint_claim_and_kafka_secrets_come_from_values(tmp_path):
    overrides = {
        "kafka": {"configSecret": {"name": "cafe-kafka"}, "tlsSecret": {"name": "cafe-kafka-tls"}},
        "checkpoint": {"persistentVolumeClaim": {"enabled": True, "size": "5Gi"}},
    }
    rendered = render(_queue(), output_dir=tmp_path, overrides=overrides)
    claim = _find(rendered.objects, "PersistentVolumeClaim")
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    driver = _find(rendered.objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in driver["env"]}
    assert env["QUEUEPLANE_KAFKA_CONFIG"] == "/etc/queueplane/kafka/client.properties"
    assert driver["args"][-2:] == ["--checkpoint-dir", "/var/queueplane/checkpoints"]
    assert _find(rendered.objects, "Deployment")["spec"]["strategy"]["type"] == "Recreate", "one checkpoint writer"
    (template,) = executor_pod_templates(rendered.objects)
    assert {v["name"] for v in template["spec"]["volumes"]} >= {"kafka-tls", "spark-local-dir-1", "tmp"}
    assert not [o for o in rendered.objects if o["kind"] == "Secret"], "Kafka secrets are referenced, never rendered"
    assert rendered.values["sparkAuth"] == {"existingSecret": "coffee-orders-spark-auth"}


@pytest.mark.parametrize(
    ("event_log", "checkpoint", "expected"),
    [
        ({"dir": "s3a://spark-history/events"}, {}, "s3a://spark-history/events"),
        ({"dir": ""}, {"persistentVolumeClaim": {"enabled": True}}, "/var/queueplane/checkpoints/spark-events"),
        ({"dir": ""}, {}, None),
    ],
)
def test_event_logs_go_to_the_dir_given_else_beside_the_checkpoints_else_the_render_says_why(
    tmp_path, event_log, checkpoint, expected
):
    overrides = {"spark": {"eventLog": {"enabled": True, **event_log}}, "checkpoint": checkpoint}
    if expected is None:
        with pytest.raises(QueueplaneError, match=r"spark\.eventLog\.enabled needs spark\.eventLog\.dir"):
            render(_queue(), output_dir=tmp_path, overrides=overrides)
        return
    args = _driver(render(_queue(), output_dir=tmp_path, overrides=overrides).objects)["args"]
    assert args[args.index("--event-log-dir") + 1] == expected


def test_probes_ask_the_worker_its_health_and_the_driver_uses_the_refreshing_in_cluster_token(tmp_path):
    rendered = render(_queue(), output_dir=tmp_path)
    driver = _find(rendered.objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert driver["livenessProbe"]["httpGet"]["path"] == "/livez" == driver["startupProbe"]["httpGet"]["path"]
    assert driver["readinessProbe"]["httpGet"]["path"] == "/readyz"
    args = _submit_args(driver)
    assert not [a for a in args if "oauthTokenFile" in a], "Spark reads a token file once; bound tokens expire"
    assert "spark.ui.killEnabled=false" in args and "spark.ui.port=4040" in args
    service = _find(rendered.objects, "Service")
    assert {"name": "spark-ui", "port": 4040, "targetPort": "spark-ui"} in service["spec"]["ports"]


def test_spark_rpc_is_authenticated_and_encrypted_with_the_releases_secret_never_written_into_a_pod(coffee, tmp_path):
    """The driver reads the per-release secret from a mounted file, each executor from a variable
    referring to the Secret; Spark neither makes one nor puts one in the executor pods' spec.
    The Secret is the deploy's (spark_auth.py); without existingSecret the chart makes the same."""
    own = render(_queue(), output_dir=tmp_path, overrides={"sparkAuth": {"existingSecret": ""}})
    secret = _find(own.objects, "Secret")
    assert secret["metadata"]["name"] == "coffee-orders-spark-auth"
    raw = base64.b64decode(secret["data"]["secret"])
    assert len(raw) == 64, "the driver's file"
    assert base64.b64decode(secret["data"]["secret-base64"]) == base64.b64encode(raw), "Spark keys a file in base64"
    args = _submit_args(_driver(coffee.objects))
    assert {
        "spark.authenticate=true",
        "spark.authenticate.secret.file=/etc/queueplane/spark-auth/secret",
        "spark.kubernetes.executor.secretKeyRef._SPARK_AUTH_SECRET=coffee-orders-spark-auth:secret-base64",
        "spark.network.crypto.enabled=true",
    } <= set(args)
    assert not [a for a in args if a.startswith("spark.authenticate.secret=")], "no secret in the pod spec"
    deployment = _find(coffee.objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in deployment["volumes"]}
    assert volumes["spark-auth"]["secret"]["secretName"] == "coffee-orders-spark-auth"
    mounts = {m["name"]: m["mountPath"] for m in _driver(coffee.objects)["volumeMounts"]}
    assert mounts["spark-auth"] == "/etc/queueplane/spark-auth"


def test_network_policies_let_the_release_reach_itself_dns_kafka_and_the_api_server_and_only_metrics_in(tmp_path):
    overrides = {"networkPolicy": {"kafka": {"ports": [9093, 9094]}}}
    policies = {
        o["metadata"]["name"]: o["spec"]
        for o in render(_queue(), output_dir=tmp_path, overrides=overrides).objects
        if o["kind"] == "NetworkPolicy"
    }
    release = {"app.kubernetes.io/name": "queue-worker", "app.kubernetes.io/instance": "coffee-orders"}
    pods = policies["coffee-orders"]
    assert pods["podSelector"] == {"matchLabels": release}, "driver and executors"
    assert pods["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": release}}]},
        {"ports": [{"port": 9404, "protocol": "TCP"}]},
    ]
    ports = [sorted((p["protocol"], p["port"]) for p in rule.get("ports", [])) for rule in pods["egress"]]
    assert pods["egress"][0] == {"to": [{"podSelector": {"matchLabels": release}}]}
    assert ports[1:] == [[("TCP", 53), ("UDP", 53)], [("TCP", 9093), ("TCP", 9094)]]
    driver = policies["coffee-orders-driver"]
    assert driver["podSelector"]["matchLabels"] == {**release, "app.kubernetes.io/component": "driver"}
    assert driver["egress"] == [{"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}]
    off = render(_queue(), output_dir=tmp_path, overrides={"networkPolicy": {"enabled": False}})
    assert "NetworkPolicy" not in {o["kind"] for o in off.objects}


def test_the_chart_works_as_a_subchart_with_global_values(tmp_path):
    values = yaml.safe_load((chart_path() / "values.yaml").read_text())
    values["global"] = {"imageRegistry": "registry.example.com", "storageClass": "fast"}
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    result = run_helm(["template", "q", str(chart_path()), "--values", str(file)], check=False)
    assert result.returncode == 0, result.stderr


def test_values_schema_is_strict():
    chart = str(chart_path())
    for bad in ("unknown=1", "image.tag=latest", "driver.cores=two", "kafka.configSecret.extra=x"):
        with pytest.raises(HelmError):
            run_helm(["template", "q", chart, "--set", bad])


@pytest.mark.parametrize(
    "setting",
    ["spark.ssl.keyStorePassword", "spark.authenticate.secret", "spark.kafka.sasl.jaas.config", "spark.hadoop.x.token"],
)
def test_values_never_carry_credentials_in_spark_settings(setting, tmp_path):
    """Credentials reach the worker only through Secrets: a Spark setting named like one is refused
    by queueplane (naming it) and by the chart's schema (for helm alone)."""
    values = tmp_path / "cluster.yaml"
    values.write_text(yaml.safe_dump({"spark": {"conf": {setting: "x"}}}))
    with pytest.raises(UsageError, match=f"/spark/conf/{setting}: credentials never go into chart values"):
        cluster_values.from_files([str(values)])
    escaped = setting.replace(".", "\\.")  # helm's --set reads dots as nesting
    with pytest.raises(HelmError, match=f"invalid propertyName '{setting}'"):
        run_helm(["template", "q", str(chart_path()), "--set-string", f"spark.conf.{escaped}=x"])
    ok = run_helm(["template", "q", str(chart_path()), "--set-string", "spark.conf.spark\\.sql\\.ansi\\.enabled=true"])
    assert "spark.sql.ansi.enabled=true" in ok.stdout


def test_kubernetes_schema_rejects_unknown_fields_wrong_types_and_missing_fields(coffee):
    cases = [
        (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolcy="Always"), "imagePullPolcy"),
        (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports=[{"containerPort": "80"}]), "80"),
        (lambda d: d["spec"].pop("selector"), "selector"),
    ]
    for mutate, needle in cases:
        objects = copy.deepcopy(coffee.objects)
        mutate(_find(objects, "Deployment"))
        with pytest.raises(ManifestInvalid, match=needle):
            validate_manifests(objects)
    objects = copy.deepcopy(coffee.objects)
    template = yaml.safe_load(_find(objects, "ConfigMap")["data"]["executor-pod-template.yaml"])
    template["spec"]["containers"][0]["securityContxt"] = {}
    _find(objects, "ConfigMap")["data"]["executor-pod-template.yaml"] = yaml.safe_dump(template)
    with pytest.raises(ManifestInvalid, match="securityContxt"):
        validate_manifests(objects)


def _driver(objects):
    return _find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda o: _driver(o).update(image="registry.example.com/queueplane/worker:latest"), ":latest"),
        (lambda o: _driver(o).update(image="registry.example.com/queueplane/worker"), "no tag"),
        (lambda o: _driver(o)["resources"]["requests"].pop("memory"), "resources.requests.memory"),
        (lambda o: _driver(o).pop("resources"), "resources.limits.memory"),
        (lambda o: _driver(o)["securityContext"].update(runAsUser=0), "runs as root"),
        (lambda o: _find(o, "Deployment")["spec"]["template"]["spec"].pop("securityContext"), "runAsNonRoot"),
        (lambda o: _driver(o)["securityContext"].update(readOnlyRootFilesystem=False), "writable root"),
        (lambda o: _find(o, "Role")["rules"][0]["verbs"].append("patch"), "grants \\['patch'\\] on pods"),
        (lambda o: _find(o, "Role")["rules"][1]["resources"].append("secrets"), "'secrets'"),
        (lambda o: _find(o, "Role")["rules"][0]["verbs"].append("*"), "grants \\['\\*'\\]"),
        (lambda o: _find(o, "Role")["rules"][2]["resourceNames"].append("other-queue"), "only the release's own"),
        (lambda o: _find(o, "Role")["rules"][2].update(resourceNames=[]), "only the release's own"),
        (lambda o: _find(o, "Role")["rules"][2]["resources"].append("queues"), "'queueplane.io/queues'"),
        (lambda o: _find(o, "Role")["rules"][0].update(resourceNames=["x"]), "generated names"),
        (lambda o: _find(o, "Queue")["spec"]["group"].update(type="fifo"), "/spec/group/type"),
        (lambda o: _find(o, "Queue")["spec"].update(colour="red"), "/spec"),
        (lambda o: _find(o, "Queue")["spec"]["topic"].update(partitions=0), "/spec/topic/partitions"),
    ],
)
def test_policy_rejects(coffee, mutate, needle):
    objects = copy.deepcopy(coffee.objects)
    mutate(objects)
    with pytest.raises(ManifestInvalid, match=needle):
        validate_manifests(objects)


def test_the_role_grants_exactly_the_driver_verbs(coffee):
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in _find(coffee.objects, "Role")["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == {k: set(v) for k, v in DRIVER_RBAC.items()}
    (status_rule,) = [r for r in _find(coffee.objects, "Role")["rules"] if r["apiGroups"] == ["queueplane.io"]]
    assert status_rule["resourceNames"] == ["coffee-orders"], "only the release's own Queue"


def test_the_queue_object_carries_the_spec_and_the_driver_reports_to_it(coffee):
    queue = _find(coffee.objects, "Queue")
    digest = hashlib.sha256(coffee.values["queues"][0]["specJson"].encode()).hexdigest()
    assert queue["metadata"] == {
        "name": "coffee-orders",
        "namespace": "cafe",
        "labels": queue["metadata"]["labels"],
        "annotations": {"queueplane.io/spec-digest": digest},
    }
    assert queue["metadata"]["labels"]["queueplane.io/queue"] == "coffee-orders"
    assert queue["metadata"]["labels"]["queueplane.io/team"] == "cafe"
    written = yaml.safe_load((EXAMPLES / "cafe" / "coffee-orders.yaml").read_text())
    assert queue["spec"] == written["spec"], "the spec as its file wrote it, no defaults added"
    assert queue["spec"]["topic"]["config"] == {"retention.ms": 604800000}, "numbers stay whole"
    args = _driver(coffee.objects)["args"]
    assert args[args.index("--status-namespace") + 1] == "cafe"


def test_without_the_queue_resource_there_is_no_object_no_grant_and_no_report(tmp_path):
    rendered = render(_queue(), output_dir=tmp_path, overrides={"queueResource": {"enabled": False}})
    assert not [o for o in rendered.objects if o["kind"] == "Queue"]
    assert all(r["apiGroups"] == [""] for r in _find(rendered.objects, "Role")["rules"])
    assert "--status-namespace" not in _driver(rendered.objects)["args"]


def test_free_text_in_a_spec_cannot_inject_yaml_or_template_syntax(tmp_path):
    doc = yaml.safe_load((EXAMPLES / "cafe" / "coffee-orders.yaml").read_text())
    doc["metadata"]["description"] = (
        'x"\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: stolen}\n{{ .Release.Name }} {{ fail "boom" }}'
    )
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump(doc))
    queue = steps.validate([str(path)], None)[0]
    rendered = render(queue, output_dir=tmp_path / "out")
    assert sorted(o["kind"] for o in rendered.objects) == sorted(o["kind"] for o in render(_queue()).objects)
    spec = yaml.safe_load(_find(rendered.objects, "ConfigMap")["data"][f"{queue.name}.yaml"])
    assert spec["metadata"]["description"] == doc["metadata"]["description"]


@pytest.mark.parametrize(
    ("field", "value", "pointer"),
    [
        ("name", "q\nkind: Secret", "/metadata/name"),
        ("team", 'a"b', "/metadata/team"),
        ("namespace", "ns}}{{", "/spec/deployment/namespace"),
        ("image", "registry.example.com/w:1\n  - --evil", "/spec/deployment/image"),
        ("image", "registry.example.com/w:latest", "/spec/deployment/image"),
        ("executor", {"cores": 1, "memory": "1g\n- x"}, "/spec/deployment/executor/memory"),
    ],
)
def test_spec_strings_that_reach_manifests_are_checked_whatever_built_the_spec(field, value, pointer):
    queue = dataclasses.replace(_queue(), **{field: value})
    with pytest.raises(SpecInvalid) as caught:
        render(queue)
    assert caught.value.problems[0].pointer == pointer


def test_cli_render(tmp_path, cli_env):
    result = run_cli(
        ["render", str(EXAMPLES / "messaging" / "email-jobs.yaml"), "--output-dir", str(tmp_path)], cli_env
    )
    assert result.returncode == 0, result.stderr
    assert "Deployment/email-jobs" in result.stdout
    assert (tmp_path / "manifests.yaml").is_file() and (tmp_path / "values.yaml").is_file()
    printed = run_cli(["render", str(EXAMPLES / "messaging" / "email-jobs.yaml")], cli_env)
    assert printed.returncode == 0 and "kind: Deployment" in printed.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (EXAMPLES / "messaging" / "email-jobs.yaml").read_text().replace("name: email-jobs", "name: Email_Jobs")
    )
    failed = run_cli(["render", str(bad)], cli_env)
    assert failed.returncode == 2 and "/metadata/name" in failed.stderr and "Traceback" not in failed.stderr


def test_cli_deploy_dry_run_renders_and_names_the_upgrade_the_airflow_task_runs(tmp_path, cli_env):
    kubeconfig = tmp_path / "kubeconfig"
    result = run_cli(
        ["deploy", str(EXAMPLES / "cafe" / "coffee-orders.yaml"), "--dry-run", "--kubeconfig", str(kubeconfig)], cli_env
    )
    assert result.returncode == 0, result.stderr
    assert "helm upgrade --install coffee-orders" in result.stdout
    assert "--namespace cafe" in result.stdout and "--rollback-on-failure --wait" in result.stdout
    unreachable = run_cli(
        ["deploy", str(EXAMPLES / "cafe" / "coffee-orders.yaml"), "--kubeconfig", str(kubeconfig)], cli_env
    )
    assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr
    assert unreachable.stderr.startswith("error: "), unreachable.stderr


def test_cli_render_takes_cluster_values_from_files_but_not_the_specs_own(tmp_path, cli_env):
    values = tmp_path / "cluster.yaml"
    values.write_text(
        "kafka: {configSecret: {name: cafe-kafka}}\ncheckpoint: {persistentVolumeClaim: {enabled: true}}\n"
    )
    result = run_cli(["render", str(EXAMPLES / "cafe" / "coffee-orders.yaml"), "--values", str(values)], cli_env)
    assert result.returncode == 0, result.stderr
    assert "cafe-kafka" in result.stdout and "kind: PersistentVolumeClaim" in result.stdout
    owned = tmp_path / "owned.yaml"
    owned.write_text("executor: {cores: 64}\n")
    refused = run_cli(["render", str(EXAMPLES / "cafe" / "coffee-orders.yaml"), "--values", str(owned)], cli_env)
    assert refused.returncode == 2 and f"{owned}: /executor comes from the queue's spec" in refused.stderr


def test_cli_render_set_overrides_the_values_files_as_helm_does(tmp_path, cli_env):
    values = tmp_path / "cluster.yaml"
    values.write_text("image: {repository: registry.example.com/team/worker, tag: '1.0.0'}\n")
    coffee = str(EXAMPLES / "cafe" / "coffee-orders.yaml")
    result = run_cli(
        ["render", coffee, "--values", str(values), "--set", "image.tag=2.0.0", "--set", "kafka.configSecret.name=k"],
        cli_env,
    )
    assert result.returncode == 0, result.stderr
    images = {c["image"] for o in yaml.safe_load_all(result.stdout) if o for c in _containers(o)}
    assert images == {"registry.example.com/team/worker:2.0.0"}, "the --set tag wins over the file's"
    assert 'secretName: "k"' in result.stdout, "a nested --set path reaches the chart"
    for bad, says in (
        ("executor.cores=64", "--set executor.cores=64: /executor comes from the queue's spec"),
        ("image.tag", "--set image.tag: expected key.path=value"),
        ("image..tag=1", "--set image..tag=1: expected key.path=value"),
    ):
        refused = run_cli(["render", coffee, "--set", bad], cli_env)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr


def _containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec) if obj["kind"] != "Pod" else spec
    return [*pod.get("containers", []), *pod.get("initContainers", [])]


def _application_specs(folder, application="cafe-workers"):
    """The three examples (share, kmq, consumer) as queues of team cafe in one worker application."""
    deployment = yaml.safe_load((EXAMPLES / "cafe" / "coffee-orders.yaml").read_text())["spec"]["deployment"]
    paths = []
    for example in SPECS:
        doc = yaml.safe_load(example.read_text())
        doc["metadata"]["team"] = "cafe"
        doc["spec"]["deployment"] = {**deployment, "application": application}
        doc["spec"].get("access", {}).pop("worker", None)
        path = folder / example.name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(path)
    return steps.validate([str(p) for p in paths], None)


def test_an_application_of_three_queues_is_one_driver_with_a_queue_object_and_a_spec_per_queue(tmp_path):
    queues = _application_specs(tmp_path)
    assert sorted(q.group.type for q in queues) == ["consumer", "kmq", "share"]
    rendered = render(queues, output_dir=tmp_path / "out")
    assert rendered.release == "cafe-workers" and rendered.namespace == "cafe"
    assert sorted(o["kind"] for o in rendered.objects).count("Deployment") == 1
    objects = {o["metadata"]["name"]: o for o in rendered.objects if o["kind"] == "Queue"}
    assert sorted(objects) == sorted(q.name for q in queues)
    for queue in queues:
        shown = objects[queue.name]
        assert shown["spec"] == yaml.safe_load(Path(queue.source).read_text())["spec"]
        assert shown["metadata"]["labels"]["queueplane.io/queue"] == queue.name
        assert shown["metadata"]["labels"]["queueplane.io/application"] == "cafe-workers"
        assert _find(rendered.objects, "ConfigMap")["data"][f"{queue.name}.yaml"] == Path(queue.source).read_text()
    driver = _driver(rendered.objects)
    specs = [driver["args"][i + 1] for i, arg in enumerate(driver["args"]) if arg == "--spec"]
    assert specs == [f"/etc/queueplane/spec/{q.name}.yaml" for q in queues]
    # The pool starts at the sum of the queues' minimums; its ceiling is the sum of their maximums.
    assert f"spark.executor.instances={sum(q.min_executors for q in queues)}" in _submit_args(driver)
    assert rendered.values["autoscaling"]["maxExecutors"] == sum(q.max_executors for q in queues)
    # Consumer and kmq queues read their partitions whole: no second driver beside the first in a rollout.
    assert _find(rendered.objects, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    status_grant = _find(rendered.objects, "Role")["rules"][2]
    assert status_grant["resources"] == ["queues/status"] and sorted(status_grant["resourceNames"]) == sorted(objects)
    for obj in rendered.objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "cafe-workers"


def test_specs_of_two_applications_are_not_one_release(tmp_path):
    queues = _application_specs(tmp_path)
    other = dataclasses.replace(queues[1], application="other")
    with pytest.raises(UsageError, match=r"belong to 2 worker applications \(cafe-workers, other\)"):
        render([queues[0], other])


def test_the_deploy_command_renders_every_spec_it_is_given_as_one_release(tmp_path, cli_env):
    paths = [q.source for q in _application_specs(tmp_path)]
    result = run_cli(["render", *paths, "--output-dir", str(tmp_path / "out")], env=cli_env)
    assert result.returncode == 0, result.stderr
    assert "release cafe-workers in namespace cafe" in result.stdout
    assert result.stdout.count("Queue/") == 3


def test_every_key_a_pod_mounts_from_a_config_map_of_the_release_is_there(tmp_path):
    """A missing key leaves the pod in ContainerCreating for good: the kubelet cannot build the volume."""
    for rendered in (render(_queue(), output_dir=tmp_path / "one"), render(_application_specs(tmp_path))):
        maps = {o["metadata"]["name"]: o["data"] for o in rendered.objects if o["kind"] == "ConfigMap"}
        pod = _find(rendered.objects, "Deployment")["spec"]["template"]["spec"]
        mounted = [v["configMap"] for v in pod["volumes"] if "configMap" in v]
        assert mounted
        for volume in mounted:
            assert {item["key"] for item in volume["items"]} <= set(maps[volume["name"]]), volume
