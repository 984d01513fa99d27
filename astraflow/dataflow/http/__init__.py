"""The dataflow service's HTTP layer: the route table, the FastAPI app and the raw-ASGI fast path
built from it, the access rules and guard, and body encoding. It calls the operations layer
(:mod:`astraflow.dataflow.ops`) and nothing calls it but the process entry (``main.py``)."""
