"""A GlusterFS volume mounted twice (two nodes' clients of one network filesystem), for a test module
that asks with `pytest_plugins = ["glusterfs_volume"]`; hpc/localcluster/glusterfs.py makes it.

Skips where GlusterFS cannot run; under CI that fails instead (tools/sysdeps.sh installs it)."""

from __future__ import annotations

import pytest
from ci import skip_or_fail

from hpc.localcluster import glusterfs


def _volume(tmp_path_factory, name: str, cache_s: float | None):
    why = glusterfs.missing()
    if why:
        skip_or_fail("the shared-filesystem tests", why)
    root = tmp_path_factory.mktemp(name)
    vol = glusterfs.up(root, clients=2, cache_s=cache_s)
    return root, vol


@pytest.fixture(scope="module")
def gluster(tmp_path_factory):
    """Two mounts with GlusterFS's own cache timeouts (1 s)."""
    root, vol = _volume(tmp_path_factory, "gluster", None)
    try:
        yield vol
    finally:
        glusterfs.down(root)


@pytest.fixture(scope="module")
def gluster_nfs_caches(tmp_path_factory):
    """Two mounts with NFS-like caches: attributes, entries and misses trusted for 3 s."""
    root, vol = _volume(tmp_path_factory, "gluster-nfs", 3.0)
    try:
        yield vol
    finally:
        glusterfs.down(root)
