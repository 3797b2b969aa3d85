"""The CLI's habits for scripts and shells: -o json|yaml for data and errors, completion scripts."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from helpers import EXAMPLES, REPO, run_cli

from queueplane.deploy.cluster_values import from_sets
from queueplane.errors import EXIT_INVALID, UsageError


@pytest.mark.parametrize("output, parse", [("json", json.loads), ("yaml", yaml.safe_load)])
def test_data_and_errors_are_one_object_on_stdout_in_the_format_asked(output, parse, tmp_path, cli_env):
    valid = run_cli(["validate", str(EXAMPLES), "-o", output], cli_env)
    assert valid.returncode == 0, valid.stderr
    assert {s["name"] for s in parse(valid.stdout)["specs"]} == {"coffee-orders", "payment-events", "email-jobs"}

    missing = run_cli(["validate", str(tmp_path / "nowhere.yaml"), "-o", output], cli_env)
    assert missing.returncode == EXIT_INVALID
    assert parse(missing.stdout) == {
        "error": {
            "kind": "UsageError",
            "exit_code": EXIT_INVALID,
            "message": f"{tmp_path / 'nowhere.yaml'}: no such file or directory",
        }
    }
    assert missing.stderr.startswith("error: ") and len(missing.stderr.splitlines()) == 1, "people still get a line"

    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: queueplane.io/v1\nkind: Queue\nmetadata: {name: x, team: t}\nspec: {}\n")
    invalid = run_cli(["validate", str(bad), "-o", output], cli_env)
    assert invalid.returncode == EXIT_INVALID
    problems = parse(invalid.stdout)["problems"]
    assert problems and all(p["file"] == str(bad) and p["pointer"].startswith("/spec") for p in problems)


def test_set_reads_paths_and_scalars_as_helm_does():
    assert from_sets(["image.tag=1.2.3", "metrics.port=9090", "spark.ui.enabled=false", "image.tag=2"]) == {
        "image": {"tag": 2},
        "metrics": {"port": 9090},
        "spark": {"ui": {"enabled": False}},
    }
    assert from_sets([r"podAnnotations.example\.com/team=cafe", "kafka.configSecret.name="]) == {
        "podAnnotations": {"example.com/team": "cafe"},
        "kafka": {"configSecret": {"name": ""}},
    }
    assert from_sets(["image.tag=[1, 2]"]) == {"image": {"tag": "[1, 2]"}}, "lists belong in a values file"
    with pytest.raises(UsageError, match="/autoscaling comes from the queue's spec"):
        from_sets(["autoscaling.maxExecutors=99"])


def _completion(shell: str, cli_env: dict[str, str]) -> str:
    result = run_cli(["completion", shell], cli_env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_bash_completes_commands_flags_and_spec_paths(tmp_path, cli_env):
    script = tmp_path / "queueplane.bash"
    script.write_text(_completion("bash", cli_env))

    def complete(*words: str) -> list[str]:
        probe = (
            f"source {script}; COMP_WORDS=(queueplane {' '.join(words)}); COMP_CWORD={len(words)}; "
            'COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; _shtab_queueplane; '
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("pl") == ["plan"]
    assert complete("plan", "--det") == ["--detailed-exitcode"]
    assert complete("local", "kubernetes", "st") == ["status"]
    assert complete("validate", "specs/examples/cafe/coffee") == ["specs/examples/cafe/coffee-orders.yaml"]
    assert "yaml" in complete("lag", "-o", "")


def test_zsh_loads_the_completion_through_compinit(tmp_path, cli_env):
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "_queueplane").write_text(_completion("zsh", cli_env))
    probe = (
        f"fpath=({functions} $fpath); autoload -U compinit; compinit -u -d {tmp_path}/zcompdump; "
        "print -r -- ${_comps[queueplane]}; autoload +X _queueplane && print -r -- ${+functions[_queueplane]}"
    )
    done = subprocess.run(  # Debian's zsh, which make test installs (test-host)
        ["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=30, env={"HOME": str(tmp_path)}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["_queueplane", "1"], done.stdout + done.stderr
