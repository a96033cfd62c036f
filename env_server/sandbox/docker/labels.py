"""The labels every sandbox container carries, and the one selector that finds them."""

from __future__ import annotations

LABEL_MANAGED = "tito.managed"
LABEL_SERVER = "tito.server"
LABEL_INSTANCE = "tito.instance"
LABEL_SESSION = "tito.session"


def labels(server: str, instance: str, session: str) -> dict[str, str]:
    return {LABEL_MANAGED: "1", LABEL_SERVER: server, LABEL_INSTANCE: instance, LABEL_SESSION: session}


def selector(server: str | None = None, instance: str | None = None, session: str | None = None
             ) -> dict[str, list[str]]:
    """Docker `filters` for tito's containers, narrowed to a server name, an instance or a session."""
    wanted = [f"{LABEL_MANAGED}=1"]
    for key, value in ((LABEL_SERVER, server), (LABEL_INSTANCE, instance), (LABEL_SESSION, session)):
        if value is not None:
            wanted.append(f"{key}={value}")
    return {"label": wanted}
