"""AstraFlow trainer component: TRL's GRPO trainer fed by the dataflow service.

``astraflow.trainer.source`` (no torch import) defines where batches come from;
``astraflow.trainer.grpo`` (imports torch/transformers/trl) holds :func:`build_trainer` and
:class:`AstraGRPOTrainer`. Import the latter only where training happens.
"""

from astraflow.trainer.source import (
    AckRecord,
    BatchSource,
    DataflowBatchSource,
    InProcessBatchSource,
    SourceExhausted,
)

__all__ = [
    "AckRecord",
    "BatchSource",
    "DataflowBatchSource",
    "InProcessBatchSource",
    "SourceExhausted",
]
