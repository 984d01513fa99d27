"""Bodies of the weight store's HTTP API beyond the files themselves.

The weight server (``astraflow.weights.server``) and a region's weight cache
(``astraflow.weights.cache``) serve the same routes: ``GET /weights/{policy}/latest`` and
``/{version}/meta`` answer a version's meta.json (the :class:`~astraflow.protocol.WeightVersion`
fields plus file sizes and sha256s), ``/{version}/full`` and ``/{version}/delta`` the files. The
cache adds ``GET /cache/stats``, answered with :class:`WeightCacheStats`.
"""

from __future__ import annotations

from pydantic import Field

from astraflow.protocol.models import WireModel


class WeightCacheStats(WireModel):
    """What a region-local weight cache has done since it started."""

    upstreams: dict[str, str] = Field(
        default_factory=dict, description="policy ('*' = every policy) -> upstream weight server"
    )
    files_fetched: int = Field(default=0, description="Files downloaded from upstream (misses)")
    bytes_fetched: int = Field(default=0, description="Bytes of the files downloaded upstream")
    files_rebuilt: int = Field(
        default=0, description="Snapshots rebuilt here from a cached state and deltas"
    )
    rebuild_mismatches: int = Field(
        default=0, description="Rebuilt snapshots whose sha256 differed (downloaded instead)"
    )
    hits: int = Field(default=0, description="File requests answered from the cache")
    coalesced: int = Field(
        default=0, description="Requests that waited for a download already under way"
    )
    files_served: int = 0
    bytes_served: int = Field(default=0, description="Bytes of the files sent to nodes")
    meta_requests: int = Field(default=0, description="meta/latest requests relayed upstream")
    streamed: int = Field(
        default=0, description="File requests streamed while the file was still downloading"
    )
    upstream_changes: int = Field(
        default=0, description="Policies moved to a new upstream found in the version table"
    )
    upstream_errors: int = 0
    cached_files: int = 0
    cached_bytes: int = 0
