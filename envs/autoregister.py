"""Import this module to register every installed AstraFlow env (built in and plugins) with
Gymnasium, so plain Gymnasium code can say ``gymnasium.make("astraflow.envs.autoregister:acme/Maze-v0")``
(Gymnasium imports the module before the ``:``) without calling AstraFlow's registry itself."""

from astraflow.envs.registry import default_registry

default_registry()
