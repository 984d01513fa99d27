"""Search environments (multi-turn retrieval over a local BM25 index). Importing this package is
cheap: bm25s and the corpus load only when an env is made."""

from astraflow.envs.registry import EnvSpec

SPECS: list[EnvSpec] = [
    EnvSpec(
        id="astraflow/Search-v0",
        entry_point="astraflow.envs.search.env:SearchEnv",
        family="search",
        description="Multi-turn QA with <search> over a local BM25 index",
    ),
    EnvSpec(
        id="astraflow/SearchTools-v0",
        entry_point="astraflow.envs.search.tools_env:SearchToolsEnv",
        family="search",
        description="Multi-turn QA with search(query) and open(doc_id) tools (function calling)",
    ),
]
