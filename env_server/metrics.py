"""Prometheus metrics of one server instance (own registry, so several servers can share a process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from env_server.sandbox.pool import SandboxPool

# Steps range from sub-millisecond (trivial code) to the sandbox timeout.
_STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class ServerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.sessions_active = Gauge("tito_sessions_active", "Open sessions.", registry=r)
        self.sessions_limit = Gauge("tito_sessions_limit", "Sessions admitted at once (max_sessions; auto: sized "
                                    "from this machine, see the start-up log).", registry=r)
        self.sessions_opened = Counter("tito_sessions_opened_total", "Sessions opened.", ["environment"], registry=r)
        self.sessions_closed = Counter(
            "tito_sessions_closed_total", "Sessions closed, by reason.", ["reason"], registry=r
        )
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

    def watch_pools(self, pools: Callable[[], Mapping[str, SandboxPool]]) -> None:
        """Export the figures of every image's sandbox pool, read from the pools when scraped."""
        self.registry.register(PoolCollector(pools))


class PoolCollector(Collector):
    """Each image's pool: warm depth, its learned target, sandboxes in use, starts made and failed,
    opens waiting for a start slot, opens refused after waiting, and opens that waited for a start (cold)
    (label `image`)."""

    def __init__(self, pools: Callable[[], Mapping[str, SandboxPool]]) -> None:
        self.pools = pools

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gauges = {
            "depth": GaugeMetricFamily("tito_pool_depth", "Warm sandboxes ready in the pool.", labels=["image"]),
            "target": GaugeMetricFamily("tito_pool_target", "Warm sandboxes the pool aims to keep (learned from "
                                        "demand).", labels=["image"]),
            "in_use": GaugeMetricFamily("tito_pool_in_use", "Sandboxes serving sessions.", labels=["image"]),
            "waiting": GaugeMetricFamily("tito_pool_admission_waiting", "Opens waiting for a start slot.",
                                         labels=["image"]),
        }
        counters = {
            "created": CounterMetricFamily("tito_pool_created", "Sandboxes started.", labels=["image"]),
            "failed": CounterMetricFamily("tito_pool_failed", "Sandbox starts that failed.", labels=["image"]),
            "busy": CounterMetricFamily("tito_pool_busy", "Opens refused after waiting for a start slot.",
                                        labels=["image"]),
            "cold": CounterMetricFamily("tito_pool_cold_opens", "Opens that found no warm sandbox and waited for "
                                        "one to start.", labels=["image"]),
        }
        # Limits a backend cannot enforce here and what stands in (bwrap without writable cgroups): 1 per limit.
        fallback = GaugeMetricFamily("tito_sandbox_limit_fallback", "Sandbox limits the backend cannot enforce on this "
                                     "machine (1), by limit; the health detail and the start-up log say why.",
                                     labels=["image", "backend", "limit"])
        memory = GaugeMetricFamily("tito_sandbox_memory_bytes", "Memory charged to the live sandboxes of each image's "
                                   "pool (bwrap: their cgroups).", labels=["image", "backend"])
        disk = GaugeMetricFamily("tito_sandbox_disk_free_bytes", "Free space on the disk the backend writes per sandbox "
                                 "(Docker's data root; bwrap: the root filesystems'); under sandbox.min_free_disk_mb "
                                 "no sandbox starts.", labels=["backend", "path"])
        disks: dict[tuple[str, str], int] = {}
        for image, pool in self.pools().items():
            guard = pool.backend.disk
            if guard is not None and guard.path and (pool.backend.name, guard.path) not in disks:
                free = guard.free_bytes()
                if free is not None:
                    disks[(pool.backend.name, guard.path)] = free
            for limit in pool.backend.unenforced_limits:
                fallback.add_metric([image, pool.backend.name, limit], 1)
            stats = pool.backend.stats()
            if "memory_bytes" in stats:
                memory.add_metric([image, pool.backend.name], stats["memory_bytes"])
            gauges["depth"].add_metric([image], pool.depth)
            gauges["target"].add_metric([image], pool.demand.target(pool.depth))
            gauges["in_use"].add_metric([image], pool.in_use)
            gauges["waiting"].add_metric([image], pool.admission_waiting)
            counters["created"].add_metric([image], pool.created_total)
            counters["failed"].add_metric([image], pool.failed_total)
            counters["busy"].add_metric([image], pool.busy_total)
            counters["cold"].add_metric([image], pool.cold_total)
        yield from gauges.values()
        yield from counters.values()
        for (backend_name, path), free in disks.items():
            disk.add_metric([backend_name, path], free)
        yield fallback
        yield memory
        yield disk
