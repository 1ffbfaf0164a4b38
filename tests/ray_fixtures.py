"""A real local Ray cluster for the Ray tests: a head and worker nodes, each its own processes.

One cluster per test module (starting one takes seconds); worker nodes advertise tunehub's
custom resources as ``tunehub worker`` makes them do, and their processes (so the actors'
sandboxes) load the test templates. Skips the module when Ray is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tunehub[cluster]')")

from ray.cluster_utils import Cluster  # noqa: E402

from tunehub.workers.ray_measurer import node_resources  # noqa: E402

__all__ = ["ray_cluster"]

REPO = Path(__file__).resolve().parents[1]
# Lost nodes are noticed in about two seconds, not the default thirty.
FAST_FAILURE = {
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_timeout_ms": 500,
}
NODE_ENV = {
    "TUNEHUB_TEMPLATE_MODULES": "tests.faulty_template,tests.ray_template",
    "TUNEHUB_TEST_BUILD_SECS": "0.3",
    "TUNEHUB_TEST_RUN_SECS": "0.05",
    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
}


def add_worker_node(cluster: Any, *, claim: str | None = None) -> Any:
    """Start a worker node (its own raylet and processes) offering this machine's CPU."""
    node = cluster.add_node(num_cpus=1, resources=node_resources(cpu=True, gpus=(), claim=claim))
    cluster.wait_for_nodes()
    return node


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A head node (no tunehub resources) this process is a driver of."""
    saved = {name: os.environ.get(name) for name in NODE_ENV}
    os.environ.update(NODE_ENV)  # the nodes' processes inherit it
    home = os.environ.get("TUNEHUB_HOME")
    os.environ["TUNEHUB_HOME"] = str(tmp_path_factory.mktemp("ray-home"))  # the actors' builds
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": FAST_FAILURE},
    )
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        for name, value in {**saved, "TUNEHUB_HOME": home}.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
