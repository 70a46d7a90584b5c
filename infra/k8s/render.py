#!/usr/bin/env python3
"""Render vigil's Kubernetes manifests: plain YAML templates with ${NAME} placeholders, and a Secret from the env.

Why not Helm or kustomize: both need a binary (helm, or kustomize/kubectl) to render, which neither CI nor
an operator's laptop may have; these templates are what gets applied, readable as they are, and this
script (Python standard library only) fills in a handful of names. The same renderer runs in the tests,
which validate every object against the Kubernetes API's JSON schemas and check the actuator's RBAC.

    export VIGIL_CLICKHOUSE_DSN=https://vigil:...@clickhouse.example.org:8443
    export VIGIL_NOTIFY_ALERTMANAGER_URL=http://alertmanager.monitoring:9093
    python3 infra/k8s/render.py --image registry.example.org/vigil:0.1.0 --kafka-bootstrap kafka.kafka:9092 \\
        | kubectl apply -f -

`vigil scrape`'s exporters come from --scrape-targets FILE (Prometheus file_sd JSON) into the
vigil-scrape-targets ConfigMap; without it the list is empty until the ConfigMap is edited.

Secrets (VIGIL_CLICKHOUSE_DSN, VIGIL_KAFKA_SASL_PASSWORD, VIGIL_NOTIFY_*, VIGIL_SMTP_*: the names in
SECRET_ENV) are read from this process's environment into the vigil-secrets Secret; they are never
printed anywhere but in that Secret on stdout (pipe it to kubectl, do not keep it in a file).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import string
import sys
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: Environment variables that go into the vigil-secrets Secret when set.
SECRET_ENV = (
    "VIGIL_CLICKHOUSE_DSN", "VIGIL_KAFKA_SECURITY_PROTOCOL", "VIGIL_KAFKA_SASL_MECHANISM", "VIGIL_KAFKA_SASL_USERNAME",
    "VIGIL_KAFKA_SASL_PASSWORD", "VIGIL_KAFKA_EXTRA",
    "VIGIL_NOTIFY_ALERTMANAGER_URL", "VIGIL_NOTIFY_SLACK_TOKEN", "VIGIL_NOTIFY_SLACK_CHANNEL",
    "VIGIL_NOTIFY_SLACK_WEBHOOK_URL", "VIGIL_NOTIFY_WEBHOOK_URLS", "VIGIL_NOTIFY_WEBHOOK_TOKEN",
    "VIGIL_NOTIFY_EVIDENCE_URL", "VIGIL_SMTP_HOST", "VIGIL_SMTP_PORT", "VIGIL_SMTP_STARTTLS", "VIGIL_SMTP_SSL",
    "VIGIL_SMTP_USER", "VIGIL_SMTP_PASSWORD", "VIGIL_SMTP_FROM", "VIGIL_SMTP_TO",
)
#: ``labels.exporter`` values ``vigil scrape`` takes (producers/exporters/scraper.py's aliases).
SCRAPE_EXPORTERS = ("dcgm", "dcgm-exporter", "node", "node_exporter", "node-exporter")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class RenderError(ValueError):
    pass


def _dns(value: str, what: str) -> str:
    if not _NAME.match(value) or len(value) > 63:
        raise RenderError(f"{what} must be a DNS label (a-z, 0-9, '-'), got {value!r}")
    return value


def _plain(value: str, what: str) -> str:
    if not value or any(c in value for c in "\"\\\n$") or value.strip() != value:
        raise RenderError(f"{what} must be a plain value (no quotes, backslashes, newlines or '$'), got {value!r}")
    return value


def secret(namespace: str, env: dict[str, str]) -> str:
    data = {k: base64.b64encode(env[k].encode()).decode() for k in SECRET_ENV if env.get(k)}
    obj = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
           "metadata": {"name": "vigil-secrets", "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "vigil"}},
           "data": data}
    return "# Rendered from the environment (render.py SECRET_ENV); JSON is YAML.\n" + json.dumps(obj, indent=2) + "\n"


def scrape_targets(groups: object) -> str:
    """``vigil scrape``'s targets (Prometheus file_sd groups) as a YAML scalar: one JSON string (JSON's
    string escapes are YAML's double-quoted ones). The shape ``vigil scrape`` refuses is refused here."""
    if not isinstance(groups, list):
        raise RenderError(f"--scrape-targets: expected a list of file_sd groups, got {type(groups).__name__}")
    for i, g in enumerate(groups):
        labels = (g.get("labels") or {}) if isinstance(g, dict) else None
        if (not isinstance(labels, dict) or not isinstance(g.get("targets"), list)
                or not all(isinstance(t, str) and t for t in g["targets"])):
            raise RenderError(f'--scrape-targets: group {i}: expected {{"targets": ["host:port", ...], "labels": {{...}}}}')
        if str(labels.get("exporter", "")).lower() not in SCRAPE_EXPORTERS:
            raise RenderError(f"--scrape-targets: group {i}: labels.exporter must be dcgm or node, "
                              f"got {labels.get('exporter')!r}")
    return json.dumps(json.dumps(groups))


def render(*, image: str, kafka_bootstrap: str, namespace: str = "vigil", training_namespace: str = "default",
           topic_prefix: str = "vigil", clickhouse_database: str = "vigil", cluster: str = "default",
           worker_replicas: int = 2, runtime_class: str = "nvidia", gpu_node_label: str = "nvidia.com/gpu.present",
           metrics_port: int = 9464, actuate: bool = False, agent_kmsg: bool = False, servicemonitor: bool = True,
           servicemonitor_labels: dict[str, str] | None = None, scrape: list | None = None,
           env: dict[str, str] | None = None) -> str:
    """Every manifest as one multi-document YAML stream; ``scrape``: ``vigil scrape``'s file_sd targets."""
    values = {
        "NAMESPACE": _dns(namespace, "--namespace"),
        "TRAINING_NAMESPACE": _dns(training_namespace, "--training-namespace"),
        "IMAGE": _plain(image, "--image"),
        "KAFKA_BOOTSTRAP": _plain(kafka_bootstrap, "--kafka-bootstrap"),
        "TOPIC_PREFIX": _plain(topic_prefix, "--topic-prefix"),
        "CLICKHOUSE_DATABASE": _plain(clickhouse_database, "--clickhouse-database"),
        "CLUSTER": _plain(cluster, "--cluster"),
        "WORKER_REPLICAS": str(int(worker_replicas)),
        "RUNTIME_CLASS": _dns(runtime_class, "--runtime-class"),
        "GPU_NODE_LABEL": gpu_node_label if _LABEL.match(gpu_node_label) else _plain("", "--gpu-node-label"),
        "METRICS_PORT": str(int(metrics_port)),
        "ACTUATOR_DRY_RUN": "" if actuate else ', "--dry-run"',
        "ACTUATOR_MODE": "acting" if actuate else "in dry run until rendered with --actuate",
        "SCRAPE_TARGETS": scrape_targets(scrape if scrape is not None else []),
        "SERVICEMONITOR_LABELS": "".join(f"    {_plain(k, 'label')}: \"{_plain(v, 'label value')}\"\n"
                                         for k, v in (servicemonitor_labels or {}).items()),
    }
    if not 1 <= worker_replicas <= 256 or not 1024 <= metrics_port <= 65535:
        raise RenderError("--worker-replicas must be 1..256 and --metrics-port 1024..65535")
    docs: list[str] = []
    for path in sorted(TEMPLATES.glob("*.yaml")):
        if path.name == ("40-agent.yaml" if agent_kmsg else "40-agent-kmsg.yaml"):
            continue
        if path.name == "51-servicemonitor.yaml" and not servicemonitor:
            continue
        try:
            docs.append(string.Template(path.read_text()).substitute(values))
        except KeyError as exc:
            raise RenderError(f"{path.name}: no value for ${{{exc.args[0]}}}") from None
    docs.insert(1, secret(values["NAMESPACE"], dict(os.environ if env is None else env)))
    return "---\n".join(d if d.endswith("\n") else d + "\n" for d in docs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", required=True, help="vigil image (infra/Dockerfile), e.g. registry.example.org/vigil:0.1.0")
    p.add_argument("--kafka-bootstrap", required=True, help="host:port[,host:port] of the Kafka cluster")
    p.add_argument("--namespace", default="vigil")
    p.add_argument("--training-namespace", default="default", help="namespace of the training pods the actuator manages")
    p.add_argument("--topic-prefix", default="vigil")
    p.add_argument("--clickhouse-database", default="vigil")
    p.add_argument("--cluster", default="default", help="cluster name in the agents' events")
    p.add_argument("--worker-replicas", type=int, default=2)
    p.add_argument("--runtime-class", default="nvidia", help="RuntimeClass of the NVIDIA container runtime (GPU Operator: nvidia)")
    p.add_argument("--gpu-node-label", default="nvidia.com/gpu.present", help='node label (value "true") of GPU nodes')
    p.add_argument("--metrics-port", type=int, default=9464)
    p.add_argument("--actuate", action="store_true", help="let the actuator act (default: --dry-run)")
    p.add_argument("--agent-kmsg", action="store_true", help="read /dev/kmsg in the agent (makes it privileged)")
    p.add_argument("--no-servicemonitor", action="store_true", help="leave out the ServiceMonitor (no Prometheus Operator)")
    p.add_argument("--servicemonitor-label", action="append", default=[], metavar="KEY=VALUE",
                   help="label the ServiceMonitor, e.g. release=kube-prometheus-stack (repeatable)")
    p.add_argument("--scrape-targets", metavar="FILE", help="vigil scrape's exporters: a Prometheus file_sd JSON "
                   "file (labels exporter=dcgm|node, node=NAME); default: none until the ConfigMap is edited")
    a = p.parse_args(argv)
    try:
        labels = dict(kv.split("=", 1) for kv in a.servicemonitor_label)
        scrape = json.loads(Path(a.scrape_targets).read_text()) if a.scrape_targets else None
        sys.stdout.write(render(
            image=a.image, kafka_bootstrap=a.kafka_bootstrap, namespace=a.namespace,
            training_namespace=a.training_namespace, topic_prefix=a.topic_prefix,
            clickhouse_database=a.clickhouse_database, cluster=a.cluster, worker_replicas=a.worker_replicas,
            runtime_class=a.runtime_class, gpu_node_label=a.gpu_node_label, metrics_port=a.metrics_port,
            actuate=a.actuate, agent_kmsg=a.agent_kmsg, servicemonitor=not a.no_servicemonitor,
            servicemonitor_labels=labels, scrape=scrape))
    except (RenderError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
