"""Slurm and Kubernetes backends against STUB ``scontrol`` / ``sbatch`` / ``scancel`` / ``kubectl``.

No real scheduler is involved: each stub is a shell script written into
``tmp_path/stub-bin`` and put first on PATH. A stub records its argv (one line
per call, arguments separated by tabs) into ``$STUB_ARGV_LOG`` and then, per
``$STUB_MODE``: succeeds, fails (exit 1 with an error on stderr) when its
first argument is ``$STUB_FAIL_ON`` (or always for ``fail``), or hangs.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime, timezone

import pytest

from vigil.actuators.backends import KubernetesBackend, SlurmBackend
from vigil.actuators.errors import PlanError
from vigil.actuators.executor import Executor
from vigil.actuators.inventory import Inventory
from vigil.actuators.ledger import Ledger
from vigil.actuators.safety import Safety, SafetyLimits
from vigil.actuators.state import ActionState
from vigil.schemas import Decision, Subject, to_seconds
from vigil.schemas.signing import Keyring

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
#: The decision engine's key in these tests: every decision below is signed with it.
KEYRING = Keyring({"test": b"unit-test-decision-key-0123456789"}, signing_key="test")

STUB = """#!/bin/sh
# STUB {name} for tests: records its argv, then behaves as $STUB_MODE says.
{{ printf '%s' "{name}"; for a in "$@"; do printf '\\t%s' "$a"; done; printf '\\n'; }} >> "$STUB_ARGV_LOG"
case "$STUB_MODE" in
  hang) sleep 60 ;;
  fail) echo "{name}: error: Invalid node name specified" >&2; exit 1 ;;
esac
if [ -n "$STUB_FAIL_ON" ] && [ "$1" = "$STUB_FAIL_ON" ]; then
  echo "{name}: error: $1 refused by the stub" >&2; exit 1
fi
exit 0
"""


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    """Stub executables first on PATH; returns a reader of the recorded argv lists."""
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sbatch", "scancel", "kubectl"):
        p = bin_dir / name
        p.write_text(STUB.format(name=name))
        p.chmod(0o755)
    log = tmp_path / "stub-argv.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("STUB_ARGV_LOG", str(log))
    monkeypatch.delenv("STUB_MODE", raising=False)
    monkeypatch.delenv("STUB_FAIL_ON", raising=False)

    def calls() -> list[list[str]]:
        return [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []

    return calls


def decision(action: str, *, job: str | None = "1234", node: str | None = None, plan: dict | None = None,
             reason: str = "xid 79: fell off the bus") -> Decision:
    did = uuid.uuid4()
    # (model_construct: the backends must refuse a bad name even in a model built without validation)
    return KEYRING.sign(Decision(event_time=T0, decision_id=did, idempotency_key=str(did), action=action,
                                 target=Subject.model_construct(job=job, node=node), reason=reason, plan=plan or {}))


# -- Slurm ----------------------------------------------------------------------------------------------


def test_slurm_isolate_node_drains_with_the_reason_as_one_argv_element(stubs):
    d = decision("isolate_node", job=None, node="gpu-07", plan={"reason": "XID 79 on GPU 3;\n rm -rf / `reboot`"})
    out = SlurmBackend().execute(d)
    assert out.state is ActionState.succeeded
    reason = f"reason=vigil {str(d.decision_id)[:8]}: XID 79 on GPU 3; rm -rf / `reboot`"
    assert stubs() == [["scontrol", "update", "nodename=gpu-07", "state=drain", reason]]
    assert out.argv == [["scontrol", "update", "nodename=gpu-07", "state=drain", reason]]


@pytest.mark.parametrize("action", ["restart_process", "checkpoint_restart"])
def test_slurm_restarts_requeue_the_job(stubs, action):
    out = SlurmBackend().execute(decision(action, plan={"nodes": ["gpu-01"]}))
    assert out.state is ActionState.succeeded and "requeue restarts every node" in out.detail
    assert stubs() == [["scontrol", "requeue", "1234"]]


def test_slurm_reconfigure_drains_the_excluded_nodes_then_requeues(stubs):
    d = decision("reconfigure", plan={"exclude_nodes": ["gpu-01", "gpu-02"], "workers": 6})
    out = SlurmBackend().execute(d)
    tag = f"reason=vigil {str(d.decision_id)[:8]}: xid 79: fell off the bus"
    assert stubs() == [["scontrol", "update", "nodename=gpu-01", "state=drain", tag],
                       ["scontrol", "update", "nodename=gpu-02", "state=drain", tag],
                       ["scontrol", "requeue", "1234"]]
    assert out.state is ActionState.succeeded and "workers=6 not applied" in out.detail


def test_slurm_reconfigure_with_a_resubmit_script_uses_sbatch_dependency(stubs, tmp_path):
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/sh\n")
    out = SlurmBackend(resubmit_script=script).execute(
        decision("reconfigure", plan={"exclude_nodes": ["gpu-01"], "workers": 6}))
    calls = stubs()
    assert [c[:3] for c in calls[:1]] == [["scontrol", "update", "nodename=gpu-01"]]
    assert calls[1:] == [["sbatch", "--dependency=afterany:1234", "--exclude=gpu-01", "--nodes=6", str(script)],
                         ["scancel", "1234"]]
    assert out.state is ActionState.succeeded


def test_slurm_unsupported_actions_fail_without_running_anything(stubs):
    out = SlurmBackend().execute(decision("retry_in_place"))
    assert out.state is ActionState.failed and "not supported by the slurm backend" in out.detail
    assert stubs() == []


def test_a_failing_stub_is_a_failed_outcome_with_its_stderr(stubs, monkeypatch):
    monkeypatch.setenv("STUB_MODE", "fail")
    out = SlurmBackend().execute(decision("isolate_node", job=None, node="gpu-07"))
    assert out.state is ActionState.failed
    assert "exit code 1" in out.detail and "scontrol: error: Invalid node name specified" in out.detail
    assert "nothing ran before it" in out.detail


def test_a_command_failing_midway_says_what_ran_before_it(stubs, monkeypatch):
    monkeypatch.setenv("STUB_FAIL_ON", "requeue")
    out = SlurmBackend().execute(decision("reconfigure", plan={"exclude_nodes": ["gpu-01"]}))
    assert out.state is ActionState.failed and "requeue refused by the stub" in out.detail
    assert "ran before it: scontrol update nodename=gpu-01 state=drain" in out.detail
    assert [c[1] for c in stubs()] == ["update", "requeue"]


def test_a_hanging_stub_times_out_and_is_killed_with_its_children(stubs, monkeypatch):
    monkeypatch.setenv("STUB_MODE", "hang")  # the stub's `sleep 60` is a child holding the output pipe
    t = time.monotonic()
    out = SlurmBackend(timeout_s=1.0).execute(decision("restart_process"))
    assert out.state is ActionState.timed_out and "did not finish within 1 s" in out.detail
    assert time.monotonic() - t < 10
    assert stubs() == [["scontrol", "requeue", "1234"]]


def test_a_missing_scontrol_fails_with_not_found(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    out = SlurmBackend().execute(decision("restart_process"))
    assert out.state is ActionState.failed and out.detail.startswith("scontrol not found on PATH")


@pytest.mark.parametrize("node", ["gpu-07; reboot", "$(reboot)", "-rf", "a b", "gpu`id`", "n\n1", ""])
def test_a_node_name_with_shell_metacharacters_is_refused_before_any_command(stubs, node, tmp_path):
    with pytest.raises(PlanError, match="target.node"):
        SlurmBackend().execute(decision("isolate_node", job=None, node=node))
    with pytest.raises(PlanError, match="exclude_nodes"):
        KubernetesBackend().execute(decision("reconfigure", plan={"exclude_nodes": [node]}))
    # Through the executor: a failed result, nothing run, even when the inventory "knows" the name.
    with Ledger(tmp_path / "l.sqlite", now=0.0) as ledger:
        inv = Inventory(["gpu-07"], ["1234"])
        inv._static_nodes.add(node)  # a poisoned inventory does not get past the name check
        (result, _alert) = Executor(SlurmBackend(), ledger, inv, keyring=KEYRING).handle(
            decision("isolate_node", job=None, node=node), T0)
    assert result.state == "failed" and "malformed plan: target.node" in result.detail
    assert stubs() == []


def test_slurm_dry_run_runs_nothing(stubs):
    out = SlurmBackend().execute(decision("restart_process"), dry_run=True)
    assert out.state is ActionState.succeeded and out.detail == "dry run: would run scontrol requeue 1234"
    assert out.argv == [["scontrol", "requeue", "1234"]] and stubs() == []


def test_executor_with_stub_slurm_reports_running_then_final(stubs, monkeypatch, tmp_path):
    with Ledger(tmp_path / "l.sqlite", now=to_seconds(T0)) as ledger:
        ex = Executor(SlurmBackend(timeout_s=1.0), ledger, Inventory(["gpu-07"], ["1234"]), keyring=KEYRING)
        out = ex.handle(decision("isolate_node", job=None, node="gpu-07"), T0)
        assert [(r.state, r.backend) for r in out[:2]] == [("running", "slurm"), ("succeeded", "slurm")]
        assert [(e.event_type, e.state) for e in out[2:]] == [("node_state", "drained")]
        monkeypatch.setenv("STUB_MODE", "hang")
        out = ex.handle(decision("restart_process"), T0)
        assert [r.state for r in out] == ["running", "timed_out"]
        d = decision("restart_process")
        ex_dry = Executor(SlurmBackend(), ledger, Inventory(["gpu-07"], ["1234"]), dry_run=True, keyring=KEYRING)
        out = ex_dry.handle(d, T0)
        assert [(r.state, r.backend) for r in out] == [("running", "dry-run:slurm"), ("succeeded", "dry-run:slurm")]
        assert ledger.get(d.decision_id).commands == [["scontrol", "requeue", "1234"]]
    assert len(stubs()) == 2  # the dry run added nothing


# -- Kubernetes -----------------------------------------------------------------------------------------


def test_kubernetes_cordon_delete_and_scale(stubs):
    k8s = KubernetesBackend(namespace="train", job_label="vigil.io/job", kind="statefulset")
    assert k8s.execute(decision("isolate_node", job=None, node="gpu-07")).state is ActionState.succeeded
    assert k8s.execute(decision("restart_process", job="llm-70b")).state is ActionState.succeeded
    assert k8s.execute(decision("restart_process", job="llm-70b", plan={"nodes": ["gpu-01", "gpu-02"]})).state \
        is ActionState.succeeded
    out = k8s.execute(decision("reconfigure", job="llm-70b", plan={"exclude_nodes": ["gpu-03"], "workers": 3,
                                                                  "placement": {"gpu-04": [0, 1]}}))
    assert out.state is ActionState.succeeded and "placement not applied" in out.detail
    delete = ["kubectl", "delete", "pod", "-n", "train", "-l", "vigil.io/job=llm-70b", "--wait=false"]
    assert stubs() == [
        ["kubectl", "cordon", "gpu-07"],
        delete,
        delete + ["--field-selector=spec.nodeName=gpu-01"],
        delete + ["--field-selector=spec.nodeName=gpu-02"],
        ["kubectl", "cordon", "gpu-03"],
        delete + ["--field-selector=spec.nodeName=gpu-03"],
        ["kubectl", "scale", "statefulset/llm-70b", "-n", "train", "--replicas=3"],
    ]


def test_kubernetes_failures_and_unsupported(stubs, monkeypatch):
    k8s = KubernetesBackend()
    out = k8s.execute(decision("rebalance_microbatches", plan={"microbatches": [2, 2]}))
    assert out.state is ActionState.failed and "not supported by the kubernetes backend" in out.detail
    monkeypatch.setenv("STUB_MODE", "fail")
    out = k8s.execute(decision("isolate_node", job=None, node="gpu-07"))
    assert out.state is ActionState.failed and "kubectl: error" in out.detail
    with pytest.raises(ValueError, match="label key"):
        KubernetesBackend(job_label="app=x,evil")


# -- the nodes a backend took out of service are announced drained -----------------------------------------


def roomy() -> Safety:
    """Safety limits that let every node of these small inventories be drained (the default allows one)."""
    return Safety(SafetyLimits(max_drained_fraction=1.0))


def _drained(events) -> list[tuple[str, str]]:
    from vigil.schemas import NodeState

    return [(e.source.node, e.state) for e in events if isinstance(e, NodeState)]


def test_executor_with_stub_scontrol_announces_each_node_its_drain_took_out(stubs, monkeypatch, tmp_path):
    with Ledger(tmp_path / "l.sqlite", now=to_seconds(T0)) as ledger:
        ex = Executor(SlurmBackend(timeout_s=5.0), ledger, Inventory(["gpu-07", "gpu-08", "gpu-09"], ["1234"]),
                      roomy(), keyring=KEYRING)
        iso = decision("isolate_node", job=None, node="gpu-07")
        out = ex.handle(iso, T0)
        assert [getattr(e, "state") for e in out] == ["running", "succeeded", "drained"]
        assert _drained(out) == [("gpu-07", "drained")] and str(iso.decision_id) in out[-1].reason
        # the drains ran, the requeue after them failed: both nodes are out all the same
        monkeypatch.setenv("STUB_FAIL_ON", "requeue")
        out = ex.handle(decision("reconfigure", plan={"exclude_nodes": ["gpu-08", "gpu-09"]}), T0)
        assert out[1].state == "failed" and _drained(out) == [("gpu-08", "drained"), ("gpu-09", "drained")]
        # a drain that fails takes nothing out; a restart drains nothing
        monkeypatch.setenv("STUB_MODE", "fail")
        assert _drained(ex.handle(decision("isolate_node", job=None, node="gpu-09"), T0)) == []
        monkeypatch.delenv("STUB_MODE")
        monkeypatch.delenv("STUB_FAIL_ON")
        assert _drained(ex.handle(decision("restart_process"), T0)) == []
        # a redelivered decision announces the same event again (its id: downstream drops the copy)
        again = ex.handle(iso, T0)
        assert [e.event_id for e in again] == [out_iso.event_id for out_iso in ex.handle(iso, T0)]
        assert _drained(again) == [("gpu-07", "drained")]
    assert sum(1 for argv in stubs() if argv[:2] == ["scontrol", "update"]) == 4  # the replays ran nothing


def test_dry_run_with_stub_scontrol_announces_no_drain(stubs, tmp_path):
    with Ledger(tmp_path / "l.sqlite", now=to_seconds(T0)) as ledger:
        ex = Executor(SlurmBackend(), ledger, Inventory(["gpu-07"], ["1234"]), dry_run=True, keyring=KEYRING)
        d = decision("isolate_node", job=None, node="gpu-07")
        assert _drained(ex.handle(d, T0)) == [] and _drained(ex.handle(d, T0)) == []
    assert stubs() == []


def test_executor_with_stub_kubectl_announces_each_cordoned_node(stubs, tmp_path):
    with Ledger(tmp_path / "l.sqlite", now=to_seconds(T0)) as ledger:
        ex = Executor(KubernetesBackend(), ledger, Inventory(["gpu-03", "gpu-07"], ["llm-70b"]), roomy(), keyring=KEYRING)
        assert _drained(ex.handle(decision("isolate_node", job=None, node="gpu-07"), T0)) == [("gpu-07", "drained")]
        out = ex.handle(decision("reconfigure", job="llm-70b", plan={"exclude_nodes": ["gpu-03"], "workers": 3}), T0)
        assert out[1].state == "succeeded" and _drained(out) == [("gpu-03", "drained")]
