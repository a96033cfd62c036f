"""tito environment server: gRPC service running tool calls in hardened Docker sandboxes."""

__version__ = "0.1.0"
