"""Which existing namespaces a deploy goes into: those that enforce Pod Security restricted, now."""

from __future__ import annotations

from queueplane.deploy.ownership import ENFORCE, ENFORCE_VERSION, MANAGED_BY, namespace_policy_problem

CLUSTER_MINOR = 35


def test_restricted_at_latest_or_at_the_clusters_version_or_newer_is_deployed_into():
    assert namespace_policy_problem("kitchen", {ENFORCE: "restricted"}, None) is None  # the version defaults to latest
    assert namespace_policy_problem("kitchen", {ENFORCE: "restricted", ENFORCE_VERSION: "latest"}, None) is None
    assert namespace_policy_problem("kitchen", {ENFORCE: "restricted", ENFORCE_VERSION: "v1.35"}, CLUSTER_MINOR) is None
    assert namespace_policy_problem("kitchen", {ENFORCE: "restricted", ENFORCE_VERSION: "v1.36"}, CLUSTER_MINOR) is None


def test_a_laxer_level_or_none_is_refused_naming_the_namespace_the_level_and_the_labels_to_set():
    for labels, found in (
        ({ENFORCE: "baseline"}, '"baseline"'),
        ({ENFORCE: "privileged", ENFORCE_VERSION: "latest"}, '"privileged"'),
        ({ENFORCE: "Restricted"}, '"Restricted"'),  # not a level Pod Security admission knows
        ({}, f"has no {ENFORCE} label"),
        (None, f"has no {ENFORCE} label"),
    ):
        problem = namespace_policy_problem("kitchen", labels, CLUSTER_MINOR)
        assert problem is not None and "namespace kitchen" in problem and found in problem, labels
        assert "nothing was deployed" in problem
        assert f"kubectl label namespace kitchen {ENFORCE}=restricted {ENFORCE_VERSION}=latest --overwrite" in problem
        assert "\n" not in problem and "loosened" not in problem


def test_restricted_pinned_to_an_older_policy_is_refused():
    old = namespace_policy_problem("kitchen", {ENFORCE: "restricted", ENFORCE_VERSION: "v1.22"}, CLUSTER_MINOR)
    assert old is not None and "policy version v1.22, older than the cluster's v1.35" in old
    unknown = namespace_policy_problem("kitchen", {ENFORCE: "restricted", ENFORCE_VERSION: "v1.22"}, None)
    assert unknown is not None and "not latest" in unknown
    bad = namespace_policy_problem("kitchen", {ENFORCE: "restricted", ENFORCE_VERSION: "1.35"}, CLUSTER_MINOR)
    assert bad is not None and '"1.35", not a policy version' in bad


def test_a_namespace_queueplane_created_and_someone_loosened_is_refused_and_says_so():
    problem = namespace_policy_problem("kitchen", {**MANAGED_BY, ENFORCE: "baseline"}, CLUSTER_MINOR)
    assert problem is not None and "queueplane created it restricted, so its labels were loosened since" in problem
    assert namespace_policy_problem("kitchen", {**MANAGED_BY, ENFORCE: "restricted"}, CLUSTER_MINOR) is None
