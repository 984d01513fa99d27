"""Offline evaluation: benchmark episodes run through the same workflow, engine and env runner as
training (``astraflow eval ...``), so what is evaluated is what is trained.

* :mod:`.episodes`: run tasks concurrently through a workflow and collect each outcome (generic);
* :mod:`.agents`: who answers: a real inference engine, or a scripted one (e.g. an oracle);
* :mod:`.agentbench`: AgentBench's families, tasks and report (``astraflow eval agentbench``).

Importing this package is cheap; the submodules import what they need.
"""
