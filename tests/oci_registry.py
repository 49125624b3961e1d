"""A real OCI registry on loopback (Debian's docker-registry, without systemd) for a test module that asks with
`pytest_plugins = ["oci_registry"]`: the `registry` fixture is its host:port, and `push_rootfs` puts a rootfs
there as an image, the way a site's mirror serves Docker Hub's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from hpc.images.oci_writer import dir_entries, write_oci_layout
from hpc.launch.distenv import free_port


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry on 127.0.0.1, without systemd, stopped by pid."""
    work = tmp_path_factory.mktemp("registry")
    port = free_port()
    (work / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {work / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: agentrl-test\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(work / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=open(work / "registry.log", "wb"), start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (work / "registry.log").read_text()
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def push_rootfs(rootfs: Path, layout: Path, destination: str) -> None:
    """The rootfs as a one-layer image at docker://destination (the loopback registry: no TLS)."""
    write_oci_layout(layout, [dir_entries(rootfs)], compression=[None])
    subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{destination}"],
                   check=True, capture_output=True)


def registries_conf(path: Path, prefix: str, location: str) -> Path:
    """A registries.conf (containers-registries.conf(5)) that sends `prefix` (docker.io/swebench) to `location`
    on the loopback registry, as a site's mirror config does."""
    path.write_text('unqualified-search-registries = ["docker.io"]\n\n[[registry]]\n'
                    f'prefix = "{prefix}"\nlocation = "{location}"\ninsecure = true\n')
    return path
