"""``astraflow.api`` re-exports every plugin contract, each the very object its module defines."""

from __future__ import annotations

import importlib

import astraflow.api as api

#: contract -> where it is defined (one definition, re-exported)
DEFINED_IN = {
    "TextEnv": "astraflow.envs.base",
    "EnvSpec": "astraflow.envs.spec",
    "TaskSetInfo": "astraflow.tasks.base",
    "WorkflowSpec": "astraflow.rollout.workflows.base",
    "Workflow": "astraflow.rollout.workflows.base",
    "DataflowPolicy": "astraflow.dataflow.policies.base",
    "ToolParser": "astraflow.tools.parsers",
    "Engine": "astraflow.rollout.engines.base",
}


def test_every_plugin_contract_is_the_defining_modules_object():
    for name, module in DEFINED_IN.items():
        assert getattr(api, name) is getattr(importlib.import_module(module), name), name
    assert set(api.__all__) == {n for n in dir(api) if not n.startswith("_")} - {"annotations"}


def test_entry_point_groups_are_the_ones_the_registries_read():
    from astraflow.envs.registry import EnvRegistry

    from astraflow.dataflow.policies.registry import PolicyRegistry
    from astraflow.rollout.workflows.registry import WorkflowRegistry
    from astraflow.tools.parsers import tool_parsers

    assert (api.ENV_GROUP, api.TASKS_GROUP) == ("astraflow.envs", "astraflow.tasks")
    assert (api.WORKFLOW_GROUP, api.POLICY_GROUP) == ("astraflow.workflows", "astraflow.policies")
    assert api.TOOL_PARSER_GROUP == "astraflow.tool_parsers"
    assert EnvRegistry().group == api.ENV_GROUP
    assert WorkflowRegistry().group == api.WORKFLOW_GROUP
    assert PolicyRegistry().group == api.POLICY_GROUP
    assert tool_parsers().group == api.TOOL_PARSER_GROUP
