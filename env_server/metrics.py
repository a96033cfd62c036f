"""Prometheus metrics of one server instance (own registry, so several servers can share a process)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Steps range from sub-millisecond (trivial code) to the sandbox timeout.
_STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class ServerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.sessions_active = Gauge("tito_sessions_active", "Open sessions.", registry=r)
        self.sessions_opened = Counter("tito_sessions_opened_total", "Sessions opened.", ["environment"], registry=r)
        self.sessions_closed = Counter(
            "tito_sessions_closed_total", "Sessions closed, by reason.", ["reason"], registry=r
        )
        self.pool_depth = Gauge("tito_pool_depth", "Warm sandboxes ready in the pool.", registry=r)
        self.step_latency = Histogram(
            "tito_step_latency_seconds", "Step RPC latency.", ["environment"], buckets=_STEP_BUCKETS, registry=r
        )
        self.open_latency = Histogram(
            "tito_open_session_latency_seconds", "OpenSession RPC latency.", buckets=_STEP_BUCKETS, registry=r
        )
        self.tool_calls = Counter(
            "tito_tool_calls_total", "Tool calls, by outcome.", ["environment", "tool", "outcome"], registry=r
        )
        self.errors = Counter("tito_errors_total", "Errors, by kind.", ["kind"], registry=r)
