"""infra/k8s: the renderer's output validates against the Kubernetes API's JSON schemas (offline, strict,
from the kubernetes-validate package), the actuator's RBAC grants exactly cordon/drain/eviction and the
job resources it manages, the agent runs unprivileged (privileged only with --agent-kmsg, for /dev/kmsg),
and every container runs a vigil command with options that command has."""

from __future__ import annotations

import base64
import importlib.util
import re
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("k8s_render", ROOT / "infra/k8s/render.py")
render_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_mod)

SECRET_ENV = {"VIGIL_CLICKHOUSE_DSN": "https://vigil:ch-pass-SECRET@ch.example.org:8443",
              "VIGIL_NOTIFY_ALERTMANAGER_URL": "http://alertmanager.monitoring:9093",
              "VIGIL_SMTP_PASSWORD": "smtp-SECRET", "HOME": "/root"}
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

# The prometheus-operator ServiceMonitor API (monitoring.coreos.com/v1), the part these manifests use,
# written from its documented API reference (no CRD is vendored): unknown fields are refused.
SERVICEMONITOR_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False, "properties": {
            "selector": {"type": "object", "additionalProperties": False, "properties": {
                "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "matchNames": {"type": "array", "items": {"type": "string"}}, "any": {"type": "boolean"}}},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "properties": {
                    "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                    "interval": {"type": "string", "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                    "scrapeTimeout": {"type": "string", "pattern": "^(([0-9]+)m)?(([0-9]+)s)?$"}}}},
        }},
    },
}

#: (apiGroup, resource) -> verbs: everything the actuator may do, and all any vigil account may do.
ALLOWED = {
    ("", "nodes"): {"get", "list", "patch"},
    ("", "pods"): {"get", "list", "delete"},
    ("", "pods/eviction"): {"create"},
    ("apps", "statefulsets"): {"get", "list"},
    ("apps", "statefulsets/scale"): {"get", "patch", "update"},
}


def rendered(**kw) -> list[dict]:
    text = render_mod.render(image="registry.example.org/vigil:0.1.0", kafka_bootstrap="kafka.kafka:9092",
                             training_namespace="train", env=SECRET_ENV, **kw)
    return [d for d in yaml.safe_load_all(text) if d]


def by(docs, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


VARIANTS = [{}, {"agent_kmsg": True, "actuate": True}, {"servicemonitor": False, "servicemonitor_labels": {}},
            {"servicemonitor_labels": {"release": "kube-prometheus-stack"}, "namespace": "gpu-ops"}]


@pytest.mark.parametrize("variant", VARIANTS, ids=["default", "kmsg+actuate", "no-servicemonitor", "labels"])
def test_every_object_validates_against_the_kubernetes_api_schemas(variant):
    docs = rendered(**variant)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "ConfigMap", "Secret", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
            "RoleBinding", "Deployment", "DaemonSet", "Service", "PersistentVolumeClaim"} <= kinds
    assert ("ServiceMonitor" in kinds) == variant.get("servicemonitor", True)
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICEMONITOR_SCHEMA)
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    names = [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs]
    assert len(names) == len(set(names))


def test_validation_is_strict_a_misspelt_field_fails():
    agent = by(rendered(), "DaemonSet")["vigil-agent"]
    agent["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(agent, K8S_VERSIONS[-1], strict=True)


def test_the_actuator_rbac_grants_cordon_drain_eviction_and_its_job_resources_and_nothing_more():
    docs = rendered(actuate=True)
    roles = {**{("ClusterRole", n): d for n, d in by(docs, "ClusterRole").items()},
             **{("Role", n): d for n, d in by(docs, "Role").items()}}
    granted: dict[tuple[str, str], set[str]] = {}
    for (kind, name), role in roles.items():
        for rule in role["rules"]:
            assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/nonResourceURLs tricks
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    assert "*" not in (group, res) and "*" not in rule["verbs"], rule
                    granted.setdefault((group, res), set()).update(rule["verbs"])
                    if kind == "ClusterRole":
                        assert res == "nodes", f"only nodes are cluster-wide, not {res}"
    assert granted == ALLOWED
    assert by(docs, "Role")["vigil-actuator-jobs"]["metadata"]["namespace"] == "train"
    bindings = list(by(docs, "ClusterRoleBinding").values()) + list(by(docs, "RoleBinding").values())
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "vigil-actuator", "namespace": "vigil"}]
        assert (b["roleRef"]["kind"], b["roleRef"]["name"]) in roles
    accounts = {name: sa for name, sa in by(docs, "ServiceAccount").items()}
    assert accounts["vigil"]["automountServiceAccountToken"] is False
    assert accounts["vigil-agent"]["automountServiceAccountToken"] is False
    pods = {**by(docs, "Deployment"), **by(docs, "DaemonSet")}
    assert {n for n, d in pods.items() if d["spec"]["template"]["spec"]["serviceAccountName"] == "vigil-actuator"} \
        == {"vigil-actuator"}
    # the scraper reads HTTP endpoints and writes Kafka: the account without a token
    assert pods["vigil-scrape"]["spec"]["template"]["spec"]["serviceAccountName"] == "vigil"


def _container(doc):
    [c] = doc["spec"]["template"]["spec"]["containers"]
    return c


def test_the_agent_is_unprivileged_by_default_and_privileged_only_for_kmsg():
    plain = by(rendered(), "DaemonSet")["vigil-agent"]
    spec = plain["spec"]["template"]["spec"]
    sec = _container(plain)["securityContext"]
    assert not sec.get("privileged") and sec["allowPrivilegeEscalation"] is False
    assert sec["capabilities"] == {"drop": ["ALL"]} and sec["runAsNonRoot"] is True
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e for e in _container(plain)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "resources" not in _container(plain) or "nvidia.com/gpu" not in str(_container(plain)["resources"])
    mounts = {m["mountPath"]: m for m in _container(plain)["volumeMounts"]}
    assert mounts["/sys/class/infiniband"]["readOnly"] is True and "/dev/kmsg" not in mounts
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"/sys/class/infiniband"}

    kmsg = by(rendered(agent_kmsg=True), "DaemonSet")["vigil-agent"]
    assert _container(kmsg)["securityContext"]["privileged"] is True
    kmounts = {m["mountPath"]: m for m in _container(kmsg)["volumeMounts"]}
    assert kmounts["/dev/kmsg"]["readOnly"] is True
    assert {v["hostPath"]["path"] for v in kmsg["spec"]["template"]["spec"]["volumes"] if "hostPath" in v} == \
        {"/sys/class/infiniband", "/dev/kmsg"}
    # Otherwise the same DaemonSet.
    for d in (plain, kmsg):
        c = _container(d)
        c.pop("securityContext")
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/dev/kmsg"]
        d["spec"]["template"]["spec"]["volumes"] = [v for v in d["spec"]["template"]["spec"]["volumes"]
                                                    if v["name"] != "kmsg"]
    assert plain["spec"] == kmsg["spec"]


def test_services_run_unprivileged_as_a_numeric_non_root_user():
    for name, d in by(rendered(), "Deployment").items():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        sec = _container(d)["securityContext"]
        assert sec == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}, name


def test_actuator_is_a_dry_run_unless_rendered_with_actuate():
    assert "--dry-run" in _container(by(rendered(), "Deployment")["vigil-actuator"])["command"]
    assert "--dry-run" not in _container(by(rendered(actuate=True), "Deployment")["vigil-actuator"])["command"]


def test_secrets_come_from_the_environment_into_the_secret_only():
    docs = rendered()
    [s] = by(docs, "Secret").values()
    decoded = {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
    assert decoded == {k: v for k, v in SECRET_ENV.items() if k.startswith("VIGIL_")}
    others = yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"])
    assert "SECRET" not in others
    for d in list(by(docs, "Deployment").values()) + list(by(docs, "DaemonSet").values()):
        refs = _container(d)["envFrom"]
        assert {"secretRef": {"name": "vigil-secrets", "optional": True}} in refs


def test_every_container_runs_a_vigil_command_with_options_it_has():
    from vigil.cli import app

    runner = CliRunner()
    seen = set()
    for d in list(by(rendered(actuate=True, agent_kmsg=True), "Deployment").values()) + \
            list(by(rendered(), "DaemonSet").values()):
        cmd = _container(d)["command"]
        if cmd[:2] == ["sh", "-c"]:
            parts = [shlex.split(p) for p in cmd[2].split("&&")]
            parts = [p[1:] if p[0] == "exec" else p for p in parts]
        else:
            parts = [cmd]
        for argv in parts:
            assert argv[0] == "vigil", argv
            sub = argv[1]
            result = runner.invoke(app, [sub, "--help"], terminal_width=200)
            assert result.exit_code == 0, (sub, result.output)
            for opt in [a for a in argv[2:] if a.startswith("--")]:
                assert re.search(rf"{re.escape(opt)}\b", result.output), (sub, opt)
            seen.add(sub)
    assert seen == {"migrate", "up", "worker", "actuate", "notify", "agent", "scrape"}


def test_render_refuses_values_that_would_break_the_yaml():
    with pytest.raises(render_mod.RenderError, match="--image"):
        render_mod.render(image='x"\ny: 1', kafka_bootstrap="k:9092", env={})
    with pytest.raises(render_mod.RenderError, match="--namespace"):
        render_mod.render(image="x", kafka_bootstrap="k:9092", namespace="Bad_NS", env={})


@pytest.mark.parametrize("port", [9464, 9500])
def test_every_vigil_pod_serves_metrics_on_the_port_its_service_and_the_servicemonitor_name(port):
    """The ConfigMap tells every vigil process the port and an address Prometheus can reach; every pod names
    that port `metrics`; a metrics Service selects each of them on it; the ServiceMonitor scrapes `metrics`;
    and each container runs a vigil command that serves /metrics (it takes --metrics-port)."""
    from vigil.cli import app
    from vigil.settings import Settings

    docs = rendered(metrics_port=port, agent_kmsg=False)
    config = by(docs, "ConfigMap")["vigil-config"]["data"]
    assert config["VIGIL_METRICS_PORT"] == str(port) and config["VIGIL_METRICS_HOST"] == "0.0.0.0"
    settings = Settings(**{k.removeprefix("VIGIL_").lower(): v for k, v in config.items()
                           if k.startswith("VIGIL_METRICS_")})
    services = [s for s in by(docs, "Service").values() if s["metadata"]["labels"].get("vigil.io/metrics") == "true"]
    workloads = list(by(docs, "Deployment").values()) + list(by(docs, "DaemonSet").values())
    runner = CliRunner()
    for w in workloads:
        container = _container(w)
        assert {"configMapRef": {"name": "vigil-config"}} in container["envFrom"]
        assert [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"] == [port]
        labels = w["spec"]["template"]["metadata"]["labels"]
        [svc] = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        assert svc["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics"}]
        words = shlex.split(" ".join(container["command"]))
        sub = words[max(i for i, word in enumerate(words) if word == "vigil") + 1]  # the long-running one (last)
        assert "--metrics-port" in runner.invoke(app, [sub, "--help"], terminal_width=200).output, sub
        component = {"up": "history", "actuate": "actuator"}.get(sub, sub)
        assert settings.metrics_address(component) == ("0.0.0.0", port)
    assert len(services) == len(workloads)
    monitor = by(docs, "ServiceMonitor")["vigil"]
    assert monitor["spec"]["selector"]["matchLabels"]["vigil.io/metrics"] == "true"
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])


def test_vigil_scrape_reads_the_targets_render_put_in_its_configmap_where_its_command_looks(tmp_path):
    """--scrape-targets lands in the vigil-scrape-targets ConfigMap as a file_sd list that vigil scrape's own
    loader reads back unchanged (quotes, unicode and all), mounted whole (a subPath mount would never see an
    edit) at the path the container's --targets names; the Deployment runs one replica."""
    from vigil.producers.exporters import load_targets_file

    groups = [{"targets": ["10.0.0.7:9400", "10.0.0.8:9400"], "labels": {"exporter": "dcgm"}},
              {"targets": ["10.0.0.7:9100"], "labels": {"exporter": "node_exporter", "node": 'gpu-07 "a" é'}}]
    docs = rendered(scrape=groups)
    text = by(docs, "ConfigMap")["vigil-scrape-targets"]["data"]["exporters.json"]
    deploy = by(docs, "Deployment")["vigil-scrape"]
    c = _container(deploy)
    path = Path(c["command"][c["command"].index("--targets") + 1])
    [mount] = [m for m in c["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert "subPath" not in mount and mount["readOnly"] is True and path.name == "exporters.json"
    [vol] = [v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert vol["configMap"] == {"name": "vigil-scrape-targets"}
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    (tmp_path / "exporters.json").write_text(text)
    got = [(t.kind, t.url, t.node) for t in load_targets_file(tmp_path / "exporters.json")]
    assert got == [("dcgm", "http://10.0.0.7:9400/metrics", None), ("dcgm", "http://10.0.0.8:9400/metrics", None),
                   ("node", "http://10.0.0.7:9100/metrics", 'gpu-07 "a" é')]
    # by default: an empty list, which vigil scrape reads as no targets (until the ConfigMap is edited)
    (tmp_path / "empty.json").write_text(by(rendered(), "ConfigMap")["vigil-scrape-targets"]["data"]["exporters.json"])
    assert load_targets_file(tmp_path / "empty.json") == []
    for bad in ({"targets": ["x:1"]}, [{"targets": "x:1", "labels": {"exporter": "dcgm"}}],
                [{"targets": ["x:1"], "labels": {"exporter": "prometheus"}}]):
        with pytest.raises(render_mod.RenderError, match="--scrape-targets"):
            rendered(scrape=bad)
