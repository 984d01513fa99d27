"""AgentBench dbbench: SQL agent tasks on SQLite (embedded default) or MySQL/MariaDB."""
