"""End-to-end tests against the cluster of `make k8s-up` (run them with `make e2e`)."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import KUBECONFIG, Cluster


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    # No skip: `make e2e` starts the cluster first, and a test that cannot reach it must fail.
    if not KUBECONFIG.exists():
        pytest.fail(f"no cluster: {KUBECONFIG} is missing; run `make k8s-up` (or `make e2e`)")
    found = Cluster()
    ready = found.kubectl("get", "--raw", "/readyz", check=False)
    if ready.strip() != "ok":
        pytest.fail(f"the cluster of {KUBECONFIG} is not ready: run `make k8s-down k8s-up`")
    return found
