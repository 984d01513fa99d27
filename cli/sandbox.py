"""`astraflow sandbox build-image|list`: the code sandbox's Docker image and backend availability.

The image is built locally (debootstrap + ``docker import``) because no container registry is
reachable; see :mod:`astraflow.envs.sandbox.image`.
"""

from __future__ import annotations

import typer
from astraflow.cli.common import console, fail

app = typer.Typer(
    help="Code sandboxes: build the Docker image, list usable backends.", no_args_is_help=True
)


@app.command("build-image")
def build_image_cmd(
    force: bool = typer.Option(False, "--force", help="Rebuild even if the image tag exists."),
    mirror: str = typer.Option(
        "http://deb.debian.org/debian", help="Debian mirror for debootstrap."
    ),
    tag: str = typer.Option(None, help="Image tag (default: the one the docker backend uses)."),
) -> None:
    """Build the sandbox image (needs root, debootstrap and a Docker engine; ~2-3 min)."""
    from astraflow.envs.sandbox import IMAGE, SandboxError, build_image

    try:
        with console.status("building the sandbox image (debootstrap + docker import) ..."):
            built = build_image(
                tag=tag or IMAGE,
                mirror=mirror,
                force=force,
                log=lambda msg: console.print(f"[dim]{msg}[/]"),
            )
    except SandboxError as exc:
        fail(str(exc))
    except Exception as exc:  # docker's connection errors carry the useful text
        fail(f"could not build the sandbox image: {type(exc).__name__}: {exc}")
    console.print(f"[green]ready:[/] {built}")


@app.command("list")
def list_cmd() -> None:
    """Which sandbox backends work on this machine, and why not where they do not."""
    from astraflow.envs.sandbox import available_backends, select_backend
    from rich.table import Table

    table = Table("backend", "usable", "isolation", "reason")
    isolation = {"docker": "container", "bwrap": "namespaces", "process": "NONE (rlimits only)"}
    for name, reason in available_backends().items():
        table.add_row(name, "yes" if reason is None else "no", isolation[name], reason or "")
    console.print(table)
    console.print(f"auto choice: [bold]{select_backend().name}[/]")
