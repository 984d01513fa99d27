"""AgentBench v0.2's ALFWorld ("HH", household) family: TextWorld-PDDL games played through text.

* :mod:`.wording`: turns ALFWorld's later game wording (json_2.1.2: ``move X to Y``) back into the
  json_2.1.1 wording AgentBench v0.2 ran and prompted with (``put X in/on Y``), exactly;
* :mod:`.protocol`: AgentBench v0.2's instruction, one-shot dialogue, action parsing and
  observation clean-up;
* :mod:`.game`: one game running in TextWorld (the ``alfworld`` and ``textworld[pddl]`` packages,
  an optional extra: ``pip install 'astraflow[alfworld]'``);
* :mod:`.env`: the Gymnasium env ``astraflow/AgentBench-ALFWorld-v0``.

Nothing here imports TextWorld or ALFWorld at module level: the env loads them on first use.
"""
