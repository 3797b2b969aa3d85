"""Everything queueplane downloads or builds, fetched ahead of time with progress shown.

`make demo`, `make check` and `make test` run this first (`queueplane local fetch --for TIER`),
so no timed test, demo step or Airflow task waits on a first download or build. Each item checks
its own cache (``~/.cache/queueplane`` or ``$QUEUEPLANE_CACHE``) and returns at once when it is
there; a missing cache only means the item is fetched now.

Each target fetches only the tier it uses (TIERS): the demo needs Kafka's jars and Spark's Kafka
connector, a few minutes on a fresh machine; the Kubernetes demo adds the local cluster built
from Go modules, helm and the worker image; the tests need everything. ``make check`` leaves the
local cluster out, as its tests do.

The Go builds are the longest part of a fresh machine's set-up and need nothing but Go and
Python's standard library, so the set-up starts them (``python -m queueplane.prefetch --go``)
before pip installs the project, and `local fetch` then finds them built or waits for them
(each build holds a lock). This module and what GO_BUILDS reaches import nothing else.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec

from queueplane.deploy.helm import HELM_VERSION, helm_binary
from queueplane.local.fault_proxy import TOXIPROXY_VERSION, toxiproxy_binary
from queueplane.local.kubernetes import build as kube_build
from queueplane.local.prometheus import PROMETHEUS_VERSION, build_both
from queueplane.local.spark_archive import build_archive

HEARTBEAT_S = 15.0

# What each target fetches: `make demo`, `make demo-kubernetes`, `make check`, `make test`.
DEMO, KUBERNETES, CHECK, TEST = "demo", "kubernetes", "check", "test"
TIERS = (DEMO, KUBERNETES, CHECK, TEST)
EVERY_TIER = frozenset(TIERS)


@dataclass(frozen=True)
class Item:
    label: str
    first_time: str  # what a cold fetch does and roughly how long it takes
    fetch: Callable[[], object]
    tiers: frozenset[str]  # the targets that use it
    wanted: Callable[[], bool] = lambda: True
    # Runs beside the items after it. The Go builds start first and keep both cores busy; the
    # jar downloads and the image (downloads, then the disk) wait on the network and the disk
    # meanwhile, so a fresh machine's set-up is about as long as its compiling.
    alongside: bool = False


def _spark_connector() -> object:
    from queueplane.run.spark.kafka_input import SPARK_VERSION, connector_jars

    jars = connector_jars()
    return f"{len(jars)} jars for Spark {SPARK_VERSION}"


def _kubernetes_wanted() -> bool:
    """The local cluster runs on Linux as root (containerd, a kubelet); elsewhere it is not built."""
    return sys.platform == "linux" and os.geteuid() == 0


def _worker_image() -> None:
    """The worker image, imported into the node's containerd too (the first `up` would otherwise)."""
    from queueplane.local.kubernetes.cluster import LocalKubernetes

    LocalKubernetes().preload_worker_image()


def _kubernetes_binaries() -> object:
    """The cluster's binaries, then the sandbox (pause) image made from the one it builds."""
    from queueplane.local.kubernetes import images

    folder = kube_build.bin_dir().parent
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the set-up's early start may be building them
        kube_build.build_binaries()
        return images.pause_image().reference


GO_BUILDS = (
    Item(
        f"local Kubernetes {kube_build.KUBERNETES_VERSION} binaries",
        "go build from the Go module proxy, about 6 minutes on 2 cores",
        _kubernetes_binaries,
        frozenset({KUBERNETES, TEST}),
        wanted=_kubernetes_wanted,
        alongside=True,
    ),
    Item(
        f"helm {HELM_VERSION}",
        "a Helm 4 on PATH, else go install from the Go module proxy, a few minutes",
        helm_binary,
        frozenset({KUBERNETES, CHECK, TEST}),  # the deploy, and the chart tests
        alongside=True,
    ),
    Item(
        f"toxiproxy {TOXIPROXY_VERSION} (the fault proxy of the network fault tests)",
        "go install from the Go module proxy, under a minute",
        toxiproxy_binary,
        frozenset({TEST}),  # the network fault tests are heavy, left out of `make check`
        alongside=True,
    ),
    Item(
        f"Prometheus and promtool {PROMETHEUS_VERSION} (the monitoring tests)",
        "go install from the Go module proxy, a few minutes",
        build_both,
        frozenset({CHECK, TEST}),
        alongside=True,
    ),
)


def _other_items() -> tuple[Item, ...]:
    """What needs the installed project (Kafka's clients, pyspark): imported only here."""
    from queueplane.local.stack import KAFKA_VERSION, LocalStack

    return (
        Item(
            f"Apache Kafka {KAFKA_VERSION} jars",
            "Maven Central, about a minute",
            lambda: LocalStack.default().fetch(),
            EVERY_TIER,
        ),
        Item(
            "Spark's Kafka connector jars",
            "Maven Central, under a minute",
            _spark_connector,
            EVERY_TIER,
            wanted=lambda: find_spec("pyspark") is not None,  # only where the worker extra is installed
        ),
        Item(
            "the worker image for the local Kubernetes",
            "Debian packages, wheels and jars made into an OCI image and imported into the node's containerd, "
            "a few minutes; again after each code change",
            _worker_image,
            frozenset({KUBERNETES, TEST}),
            wanted=lambda: _kubernetes_wanted() and find_spec("pyspark") is not None,
            alongside=True,
        ),
        Item(
            "a class-data archive of Spark's JVM (local Spark drivers start on about half the CPU)",
            "one short Spark job, under a minute",
            build_archive,
            frozenset({CHECK, TEST}),  # the tests' Spark drivers map it (tests/conftest.py)
            wanted=lambda: find_spec("pyspark") is not None,
        ),
    )


@contextmanager
def _heartbeat(say: Callable[[str], None], label: str, started: float) -> Iterator[None]:
    """A line every HEARTBEAT_S while a step runs, so a cold build never looks hung."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            say(f"  ... {label}: still working ({time.monotonic() - started:.0f}s)")

    thread = threading.Thread(target=beat, name="qp-fetch-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _fetch(item: Item, say: Callable[[str], None]) -> None:
    started = time.monotonic()
    say(f"{item.label}: checking the cache (first time: {item.first_time})")
    with _heartbeat(say, item.label, started):
        item.fetch()
    say(f"{item.label}: ready ({time.monotonic() - started:.1f}s)")


def tier_items(tier: str, go_only: bool = False) -> tuple[Item, ...]:
    """The items one target uses, in fetch order (the Go builds first)."""
    if tier not in TIERS:
        raise ValueError(f"unknown set-up tier {tier!r}: one of {', '.join(TIERS)}")
    items = GO_BUILDS if go_only else (*GO_BUILDS, *_other_items())
    return tuple(item for item in items if tier in item.tiers)


def fetch_all(say: Callable[[str], None] = print, go_only: bool = False, tier: str = TEST) -> None:
    """Fetch or build every item of ``tier`` not yet cached, one line per item; ``alongside``
    items in a thread. Items of other tiers are not mentioned: a demo's set-up lists only what
    the demo waits on."""
    beside: list[tuple[threading.Thread, list[BaseException]]] = []
    for item in tier_items(tier, go_only):
        if not item.wanted():
            say(f"{item.label}: skipped (not needed by this installation)")
        elif item.alongside:
            failed: list[BaseException] = []
            thread = threading.Thread(target=_run_catching, args=(item, say, failed), name=f"qp-fetch-{len(beside)}")
            thread.start()
            beside.append((thread, failed))
        else:
            _fetch(item, say)
    for thread, failed in beside:
        thread.join()
        if failed:
            raise failed[0]


def _run_catching(item: Item, say: Callable[[str], None], failed: list[BaseException]) -> None:
    try:
        _fetch(item, say)
    except BaseException as exc:  # raised again on the main thread, after the other items
        failed.append(exc)


def main(argv: list[str] | None = None) -> int:
    """``python -m queueplane.prefetch --go --for TIER``: the Go builds alone, with the standard library only."""
    parser = argparse.ArgumentParser(prog="python -m queueplane.prefetch", description=main.__doc__)
    parser.add_argument("--go", action="store_true", help="only the Go builds (before the venv exists)")
    parser.add_argument("--for", dest="tier", choices=TIERS, default=TEST, help="the target's tier (default: test)")
    args = parser.parse_args(argv)
    try:
        fetch_all(lambda line: print(line, flush=True), go_only=args.go, tier=args.tier)
    except Exception as exc:  # `local fetch` tries again and reports it where the user looks
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
