"""The Kubernetes manifests are valid (offline, kubernetes-validate's bundled schemas) and fit together:
same-path socket folder, grpc probes on the plaintext health port, TLS and tokens from mounted secrets."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.harness import REPO

K8S = REPO / "deploy" / "k8s"
VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]


def documents() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> dict:
    (doc,) = [d for _, d in documents() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate_strictly(version):
    docs = documents()
    assert {d["kind"] for _, d in docs} >= {"Namespace", "DaemonSet", "Service", "NetworkPolicy"}
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name} ({doc['kind']}) is not valid for Kubernetes {version}: {e.message}")


def test_validation_catches_a_mistake():
    service = by_kind("Service")
    service["spec"]["ports"][0]["prot"] = 50051
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p, _ in documents()}


def test_daemonset_and_service_fit_together():
    ds, svc = by_kind("DaemonSet"), by_kind("Service")
    pod = ds["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    # Headless, selecting the DaemonSet's pods, on the container's grpc port.
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert svc["spec"]["ports"][0]["targetPort"] == "grpc" and ports["grpc"] == int(env["TITO_PORT"])

    # The node's Docker socket, and the sandbox socket folder at the same path on node and container.
    assert volumes["docker-sock"]["hostPath"] == {"path": "/var/run/docker.sock", "type": "Socket"}
    assert mounts["docker-sock"]["mountPath"] == "/var/run/docker.sock"
    socket_dir = env["TITO_SANDBOX__SOCKET_DIR"]
    assert volumes["socket-dir"]["hostPath"]["path"] == mounts["socket-dir"]["mountPath"] == socket_dir

    # TLS and tokens from mounted secrets; never the insecure switch.
    assert "TITO_ALLOW_INSECURE" not in env
    secret_dirs = {mounts[n]["mountPath"]: volumes[n]["secret"]["secretName"] for n in volumes if "secret" in volumes[n]}
    for var in ("TITO_TLS__CERT_FILE", "TITO_TLS__KEY_FILE", "TITO_AUTH__TOKENS_FILE"):
        assert str(Path(env[var]).parent) in secret_dirs, var
    assert {"tito-env-tls", "tito-env-tokens"} <= set(secret_dirs.values())

    # Probes: grpc health on the plaintext health-only port (kubelet's grpc probes cannot do TLS).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"]["port"] == int(env["TITO_HEALTH_PORT"]) == ports["health"], probe
    assert server["resources"]["requests"]["cpu"] and server["resources"]["requests"]["memory"]
    # One server name per node: the start-up sweep then removes only that node's leftovers.
    name = next(e for e in server["env"] if e["name"] == "TITO_SERVER_NAME")
    assert name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_server_accepts_the_daemonset_environment(monkeypatch):
    """The DaemonSet's TITO_* variables make a valid config, public host included (the files are read
    at start-up, not here)."""
    from env_server.config import load_config

    server = by_kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    for e in server["env"]:
        monkeypatch.setenv(e["name"], e.get("value") or "node-1")
    config = load_config()
    assert config.host == "0.0.0.0" and config.tls.enabled and config.auth.tokens_file and config.health_port
