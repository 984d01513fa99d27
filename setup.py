"""Install the repository's top-level folders under one import namespace.

``envs/``, ``tasks/`` and ``cli/`` stay top-level folders in the repository (the layout the
architecture asks for: each is a part a reader looks for by name), but they install as
``astraflow.envs``, ``astraflow.tasks`` and ``astraflow.cli``, so site-packages gets one
``astraflow`` package and nothing a user's own ``tasks/`` or ``cli/`` folder can shadow or be
shadowed by. ``pyproject.toml`` holds every other setting; this file only computes the package
list, which ``[tool.setuptools.packages.find]`` cannot map to another prefix.
"""

from setuptools import find_namespace_packages, setup

#: import name -> repository folder, for the folders that live beside ``astraflow/``
SUBTREES = {"astraflow.envs": "envs", "astraflow.tasks": "tasks", "astraflow.cli": "cli"}

#: namespace discovery, as ``packages.find`` does by default: data-only folders such as the built-in
#: models' ``tiny-arith/`` ship as package data too
EXCLUDE = ["*__pycache__*"]
packages = find_namespace_packages(include=["astraflow", "astraflow.*"], exclude=EXCLUDE)
package_dir = {"astraflow": "astraflow"}
for name, folder in SUBTREES.items():
    package_dir[name] = folder
    packages += [
        name,
        *(f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=EXCLUDE)),
    ]

setup(packages=packages, package_dir=package_dir)
