"""The chart as a GitOps tool renders it: without cluster access, the same every time, and with
the monitoring objects of the cluster it is told about.

Argo CD and Flux run `helm template` with no `lookup`; whatever the chart made there at random
would change on every sync. Spark's RPC secret is therefore named (sparkAuth.existingSecret,
made once by the deploy), and `queueplane render --api-versions` says what the cluster serves.
"""

from __future__ import annotations

import base64
import copy

import pytest
import yaml
from helpers import EXAMPLES, run_cli

from queueplane.deploy import spark_auth
from queueplane.deploy.helm import run_helm
from queueplane.deploy.monitoring_schema import API_VERSIONS
from queueplane.deploy.render import ManifestInvalid, chart_path, render, validate_manifests
from queueplane.provision import steps

COFFEE = EXAMPLES / "cafe" / "coffee-orders.yaml"
MONITORING = [arg for kind in ("PodMonitor", "PrometheusRule") for arg in ("--api-versions", API_VERSIONS[kind])]


def _coffee():
    return steps.validate([str(COFFEE)], None)[0]


def test_two_renders_without_cluster_access_are_byte_identical(tmp_path):
    first = render(_coffee(), output_dir=tmp_path / "first")
    second = render(_coffee(), output_dir=tmp_path / "second")
    assert first.manifests == second.manifests
    assert (tmp_path / "first" / "values.yaml").read_bytes() == (tmp_path / "second" / "values.yaml").read_bytes()
    # What a GitOps tool runs on those values: helm template, no cluster, twice.
    args = ["template", first.release, str(chart_path()), "--namespace", first.namespace]
    runs = [run_helm([*args, "--values", str(first.values_file), *MONITORING]).stdout for _ in range(2)]
    assert runs[0] == runs[1]
    objects = [o for o in yaml.safe_load_all(runs[0]) if o]
    assert "Secret" not in {o["kind"] for o in objects}, "no secret made at random"
    driver = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in driver["volumes"] if v["name"] == "spark-auth"]
    assert volume["secret"]["secretName"] == "coffee-orders-spark-auth", "the deploy's Secret, mounted"


def test_the_chart_alone_makes_its_own_secret_which_a_lookup_less_render_cannot_repeat(tmp_path):
    """Why render names the Secret: without existingSecret, helm template draws a new one each time."""
    chart = str(chart_path())
    runs = [run_helm(["template", "q", chart]).stdout for _ in range(2)]
    assert runs[0] != runs[1]
    named = [
        run_helm(["template", "q", chart, "--set", "sparkAuth.existingSecret=platform-spark"]).stdout for _ in "ab"
    ]
    assert named[0] == named[1] and "platform-spark" in named[0] and "kind: Secret" not in named[0]


def test_the_deploys_secret_has_the_keys_the_chart_reads_in_the_form_spark_reads_them():
    made = spark_auth.new_secret()
    assert len(made["secret"]) == 64 and made["secret"].isalnum()
    assert made != spark_auth.new_secret(), "random each time the deploy makes one"
    # As the API server holds them (base64 of each value): the chart's own Secret has the same shape.
    chart_secret = next(
        o
        for o in yaml.safe_load_all(run_helm(["template", "q", str(chart_path())]).stdout)
        if o and o["kind"] == "Secret"
    )
    assert spark_auth.data_problem("q-spark-auth", chart_secret["data"]) is None
    data = {key: base64.b64encode(value.encode()).decode() for key, value in made.items()}
    assert spark_auth.data_problem("s", data) is None
    assert "no secret-base64" in spark_auth.data_problem("s", {"secret": data["secret"]})
    wrong = {**data, "secret-base64": base64.b64encode(b"other").decode()}
    assert "does not hold its secret key's bytes" in spark_auth.data_problem("s", wrong)


def test_render_takes_api_versions_and_says_in_one_line_when_it_leaves_monitoring_out(tmp_path, cli_env):
    plain = run_cli(["render", str(COFFEE)], cli_env)
    assert plain.returncode == 0, plain.stderr
    assert "kind: PodMonitor" not in plain.stdout and "kind: PrometheusRule" not in plain.stdout
    (note,) = plain.stderr.strip().splitlines()
    assert note.startswith("note: PodMonitor and PrometheusRule left out")
    assert "--api-versions monitoring.coreos.com/v1/PodMonitor" in note
    assert "--api-versions monitoring.coreos.com/v1/PrometheusRule" in note

    served = run_cli(["render", str(COFFEE), *MONITORING, "--output-dir", str(tmp_path / "out")], cli_env)
    assert served.returncode == 0, served.stderr
    assert "left out" not in served.stderr
    assert "PodMonitor/coffee-orders" in served.stdout and "PrometheusRule/coffee-orders" in served.stdout

    one = run_cli(["render", str(COFFEE), "--api-versions", API_VERSIONS["PodMonitor"]], cli_env)
    assert one.returncode == 0 and "kind: PodMonitor" in one.stdout
    assert one.stderr.strip().startswith("note: PrometheusRule left out") and "PodMonitor left" not in one.stderr

    unwanted = ["--set", "monitoring.podMonitor.enabled=false", "--set", "monitoring.prometheusRule.enabled=false"]
    quiet = run_cli(["render", str(COFFEE), *unwanted], cli_env)
    assert quiet.returncode == 0 and quiet.stderr.strip() == "", "nothing asked for, nothing left out"


def test_monitoring_objects_are_checked_against_the_prometheus_operators_schemas(tmp_path):
    rendered = render(
        _coffee(), output_dir=tmp_path, api_versions=[API_VERSIONS["PodMonitor"], API_VERSIONS["PrometheusRule"]]
    )
    kinds = {o["kind"]: o for o in rendered.objects}
    assert {"PodMonitor", "PrometheusRule"} <= set(kinds) and rendered.left_out == []
    for kind, mutate, needle in [
        ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(intervall="30s"), "intervall"),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].update(fore="10m"), "fore"),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].update(expr=["x"]), "expr"),
    ]:
        objects = copy.deepcopy(rendered.objects)
        mutate(next(o for o in objects if o["kind"] == kind))
        with pytest.raises(ManifestInvalid, match=needle):
            validate_manifests(objects)
