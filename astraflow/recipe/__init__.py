"""Recipe schema and loader (TOML + pydantic)."""

from astraflow.recipe.loader import RecipeError, load_recipe, recipe_from_dict, recipe_to_toml
from astraflow.recipe.schema import (
    DataflowConfig,
    DataflowPolicyConfig,
    EvaluationConfig,
    LoggingConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
    RunConfig,
    SamplingConfig,
    SecurityConfig,
    TasksConfig,
    TaskSetConfig,
    TrainerConfig,
    WorkflowConfig,
)

__all__ = [
    "RecipeError",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_toml",
    "DataflowConfig",
    "DataflowPolicyConfig",
    "EvaluationConfig",
    "LoggingConfig",
    "PolicyConfig",
    "Recipe",
    "RolloutConfig",
    "RunConfig",
    "SamplingConfig",
    "SecurityConfig",
    "TaskSetConfig",
    "TasksConfig",
    "TrainerConfig",
    "WorkflowConfig",
]
