"""AstraFlow: dataflow-oriented reinforcement learning for agentic LLMs.

Components live in sub-packages (``protocol``, ``dataflow``, ``rollout``, ``trainer``, ``weights``,
``launch``, ``models``, ``recipe``). Importing this package imports none of them, so the CLI stays fast.
"""

__version__ = "0.1.0"
