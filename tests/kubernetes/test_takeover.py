"""A deploy writes only its own release: in a namespace it creates Pod Security restricted (and
refuses once someone loosened it), it never replaces another queue's release, a release of
another chart, or an object Helm does not own there."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import run_cli, tagged_examples, unique_tag
from kube_support import sized_for_the_node

from queueplane.deploy.helm import run_helm

pytestmark = [pytest.mark.kubernetes, pytest.mark.kafka]


def _revisions(cluster, release: str, namespace: str) -> list[int]:
    listing = run_helm(["history", release, "--namespace", namespace, "-o", "json"], kubeconfig=str(cluster.kubeconfig))
    return [entry["revision"] for entry in json.loads(listing.stdout)]


def _foreign_chart(tmp_path):
    chart = tmp_path / "foreign"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: coredns\nversion: 1.0.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: '{{ .Release.Name }}-dns'}\ndata: {zone: example}\n"
    )
    return chart


def _renamed(path, name: str):
    """The spec at ``path`` as a queue called ``name``, in a file beside it."""
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["name"] = name
    renamed = path.with_name(f"{name}.yaml")
    renamed.write_text(yaml.safe_dump(doc, sort_keys=False))
    return renamed


@pytest.mark.timeout(900)
def test_a_deploy_makes_its_namespace_restricted_and_never_takes_over_another_release_or_object(
    cluster, pod_kafka, kafka, cli_env, tmp_path
):
    path = tagged_examples(tmp_path / "specs", unique_tag())["queue__cafe__coffee-orders"]
    doc = sized_for_the_node(path)
    release, namespace = doc["metadata"]["name"], doc["spec"]["deployment"]["namespace"]
    values = cluster.write_values(tmp_path / "cluster-values.yaml", pod_kafka.pod_bootstrap)
    kube = ["--kubeconfig", str(cluster.kubeconfig), "--values", str(values)]
    assert run_cli(["apply", str(path), "--yes", "--bootstrap-servers", kafka.bootstrap], cli_env).returncode == 0
    assert cluster.kubectl("get", "namespace", namespace, check=False).strip() == ""

    def deploy(spec_path) -> object:
        return run_cli(["deploy", str(spec_path), *kube, "--timeout", "5m"], cli_env, timeout=420)

    try:
        first = deploy(path)
        assert first.returncode == 0, first.stdout + first.stderr
        labels = json.loads(cluster.kubectl("get", "namespace", namespace, "-o", "json"))["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert labels["pod-security.kubernetes.io/warn"] == "restricted"
        assert labels["app.kubernetes.io/managed-by"] == "queueplane"

        # Another team's queue with the same name, into the same namespace: refused, release untouched.
        other = yaml.safe_load(path.read_text())
        other["metadata"]["team"] = "bakery"
        other_path = tmp_path / "bakery" / path.name
        other_path.parent.mkdir()
        other_path.write_text(yaml.safe_dump(other, sort_keys=False))
        refused = deploy(other_path)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        said = refused.stderr
        assert f'{other_path}: /metadata/name: Helm release "{release}" in namespace {namespace} exists' in said
        assert f"is application cafe/{release}" in said and "nothing was deployed" in said
        assert _revisions(cluster, release, namespace) == [1]

        # A release of another chart under a queue's name.
        run_helm(
            ["install", "dns", str(_foreign_chart(tmp_path)), "--namespace", namespace],
            kubeconfig=str(cluster.kubeconfig),
        )
        taken = deploy(_renamed(path, "dns"))
        assert taken.returncode == 2, taken.stdout + taken.stderr
        assert "is a release of chart coredns, not queueplane's" in taken.stderr
        assert _revisions(cluster, "dns", namespace) == [1]

        # An object no Helm release owns, with the name the chart would give one of its own.
        cluster.kubectl("-n", namespace, "create", "configmap", "lone-spec", "--from-literal=owner=ops")
        clash = deploy(_renamed(path, "lone"))
        assert clash.returncode == 1, clash.stdout + clash.stderr
        assert "ConfigMap" in clash.stderr and "lone-spec" in clash.stderr and "Traceback" not in clash.stderr
        kept = json.loads(cluster.kubectl("-n", namespace, "get", "configmap", "lone-spec", "-o", "json"))
        assert kept["data"] == {"owner": "ops"}
        assert "meta.helm.sh/release-name" not in (kept["metadata"].get("annotations") or {})
        assert cluster.kubectl("-n", namespace, "get", "deployment", "lone", check=False).strip() == ""

        # The namespace the deploy created, loosened since: the next deploy is refused, the release untouched.
        cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline", "--overwrite")
        loosened = deploy(path)
        assert loosened.returncode == 1, loosened.stdout + loosened.stderr
        said = loosened.stderr
        assert f"{path}: /spec/deployment/namespace: namespace {namespace} enforces Pod Security" in said, said
        assert '"baseline"' in said and "queueplane created it restricted, so its labels were loosened" in said
        assert "nothing was deployed" in said and "Traceback" not in said
        assert _revisions(cluster, release, namespace) == [1]
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
