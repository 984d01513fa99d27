"""The dataflow service's operations: what happens to the run (leases, pushes, batches, acks,
evaluations, rewinds, status), each inside one store transaction, behind the
:class:`~astraflow.dataflow.ops.service.DataflowService` facade. Independent of HTTP; all SQL
goes through :mod:`astraflow.dataflow.storage`."""
