"""AgentBench os_interaction: bash agent tasks in a throw-away system (overlay sandbox or Docker)."""
