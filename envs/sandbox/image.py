"""Building the Docker sandbox image locally (no registry is reachable from our machines).

Why debootstrap: it makes a minimal, reproducible Debian rootfs from the Debian mirror (which is
reachable) in well under a minute, with the distribution's own python3; ``docker import`` then turns
the rootfs into an image. Nothing is pulled from a container registry. The build is skipped when the
tag already exists, so CI pays for it once per fresh engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from astraflow.envs.sandbox.base import SandboxError

IMAGE = "astraflow/sandbox-python:bookworm-1"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
PACKAGES = ("python3",)
#: Trimmed from the rootfs: docs, caches and the package manager's download cache.
PRUNE = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/cache/apt/archives",
    "var/lib/apt/lists",
)


def docker_client(timeout: int = 10):
    """A docker SDK client from the environment (DOCKER_HOST etc.)."""
    import docker

    return docker.from_env(timeout=timeout)


def image_exists(client, tag: str = IMAGE) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_image(
    *,
    tag: str = IMAGE,
    mirror: str = DEFAULT_MIRROR,
    suite: str = SUITE,
    force: bool = False,
    client=None,
    log: Callable[[str], None] = print,
) -> str:
    """Build (or find) the sandbox image; returns its tag.

    Needs root, ``debootstrap`` (``apt-get install debootstrap``) and a Docker engine.
    """
    client = client or docker_client(timeout=300)
    if not force and image_exists(client, tag):
        log(f"image {tag} already exists; skipping build")
        return tag
    debootstrap = shutil.which("debootstrap")
    if not debootstrap:
        raise SandboxError(
            "building the sandbox image needs debootstrap: apt-get install -y debootstrap"
        )
    if os.getuid() != 0:
        raise SandboxError(
            "building the sandbox image needs root (debootstrap creates device nodes)"
        )
    with tempfile.TemporaryDirectory(prefix="astraflow-image-") as tmp:
        rootfs = Path(tmp, "rootfs")
        started = time.monotonic()
        log(f"debootstrap {suite} (minbase + {', '.join(PACKAGES)}) from {mirror} ...")
        cmd = [
            debootstrap,
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            suite,
            str(rootfs),
            mirror,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SandboxError(
                f"debootstrap failed ({proc.returncode}): {proc.stderr[-2000:] or proc.stdout[-2000:]}"
            )
        for rel in PRUNE:
            shutil.rmtree(rootfs / rel, ignore_errors=True)
        work = rootfs / "work"
        work.mkdir(exist_ok=True)
        work.chmod(0o1777)
        check = subprocess.run(
            ["chroot", str(rootfs), "/usr/bin/python3", "-c", "import json, hashlib"],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise SandboxError(f"the new rootfs has no working python3: {check.stderr[-1000:]}")
        log(f"rootfs ready in {time.monotonic() - started:.0f}s; importing into docker as {tag}")
        archive = Path(tmp, "rootfs.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        repository, _, version = tag.rpartition(":")
        client.api.import_image_from_file(
            str(archive),
            repository=repository,
            tag=version,
            changes=[
                "ENV PATH=/usr/local/bin:/usr/bin:/bin",
                "ENV LANG=C.UTF-8",
                "WORKDIR /work",
                "USER 65534:65534",
                'CMD ["python3"]',
            ],
        )
    if not image_exists(client, tag):
        raise SandboxError(f"docker import finished but image {tag} is missing")
    log(f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag
