"""``python -m astraflow.envs.sandbox``: build the Docker sandbox image (same as the CLI command).

For CI scripts that run before the ``astraflow`` command is wired up; skips when the tag exists.
"""

from astraflow.envs.sandbox.image import build_image

if __name__ == "__main__":
    build_image()
