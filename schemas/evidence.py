"""What correlation reads of a finding's evidence, typed.

A finding's ``evidence`` stays a free JSON object on the wire (each detector
says what it saw, and the history keeps it as it came), but the keys the
correlator acts on or shows have a type, checked once when the finding is
made or decoded: :attr:`vigil.schemas.DetectorFinding.facts` is the view of
its kind below. A finding whose evidence breaks its kind's view (a forged
``silent_peers: 5`` on the findings topic, which anyone can write) is refused
like any other invalid event; keys no view names are kept and not read.

>>> from vigil.schemas.evidence import FindingEvidence, evidence_of
>>> view = evidence_of("node_lost", {"silence_s": 3.2, "interval_s": 1.0, "silent_peers": ["n2", "n3"]})
>>> view.silence_s, view.silent_peers
(3.2, ['n2', 'n3'])
>>> evidence_of("throttle", {"sm_clock_mhz": 900}) == FindingEvidence()
True
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vigil.schemas.envelope import Name

__all__ = ["ChainBrokenEvidence", "CollectiveStuckEvidence", "EVIDENCE_VIEWS", "FailSlowEvidence", "FindingEvidence",
           "NodesSilentEvidence", "SilenceEvidence", "XidEvidence", "evidence_of"]


class FindingEvidence(BaseModel):
    """The typed part of a finding's evidence: none for a kind the correlator reads nothing of."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


class SilenceEvidence(FindingEvidence):
    """A silence: ``node_lost`` (no heartbeat) or ``task_hang`` (no step)."""

    silence_s: float | None = Field(None, description="Seconds heard nothing from the subject when found.")
    timeout_s: float | None = Field(None, description="The timeout that silence exceeded (a hang's learned one).")
    silent_peers: list[Name] = Field(default_factory=list, description="Other nodes (or jobs) whose same detector "
                                     "had heard nothing for over half its timeout: many silent at once share a cause.")
    quiet_nodes: list[Name] | None = Field(None, description="A hung job's nodes that did not talk when it was found "
                                           "(not heard for over half their heartbeat timeout, not heard a beat "
                                           "interval after the job's last sign of life, or never heard); empty: every "
                                           "node of the job talks, so no silence of theirs explains it; absent: not "
                                           "known.")


class FailSlowEvidence(FindingEvidence):
    """A job's iteration time that changed and stayed changed (``fail_slow``)."""

    rel_change: float | None = Field(None, description="after / before - 1 of the iteration time.")
    slowdown_class: Literal["computation", "communication"] | None = Field(
        None, description="Which part of the step grew, when it could be told.")


class XidEvidence(FindingEvidence):
    """An NVIDIA XID error on a GPU (``xid``)."""

    code: int | None = Field(None, description="The worst XID code seen on the GPU.")
    mnemonic: str | None = Field(None, description="Its name in the XID catalog.")
    action: str | None = Field(None, description="What the catalog says to do about it.")


class CollectiveStuckEvidence(FindingEvidence):
    """A hung job's collective compared across its ranks' flight recorders (``collective_stuck``)."""

    summary: str | None = Field(None, description="Which rank never entered or finished which collective.")


class ChainBrokenEvidence(FindingEvidence):
    """A run left to be continued that no job continues (``chain_broken``)."""

    why: str | None = Field(None, description="Which job left the run, how, and for how long nothing followed.")


class NodesSilentEvidence(FindingEvidence):
    """Many nodes silent together: the correlator's own root of a shared silence (``nodes_silent``)."""

    nodes: list[Name] = Field(default_factory=list, description="The nodes silent together.")
    likely_cause: str | None = Field(None, description="What they share that could have failed.")


#: The view of each kind's evidence; kinds not here have :class:`FindingEvidence`.
EVIDENCE_VIEWS: dict[str, type[FindingEvidence]] = {
    "node_lost": SilenceEvidence, "task_hang": SilenceEvidence, "fail_slow": FailSlowEvidence, "xid": XidEvidence,
    "collective_stuck": CollectiveStuckEvidence, "chain_broken": ChainBrokenEvidence,
    "nodes_silent": NodesSilentEvidence,
}


def evidence_of(kind: str, evidence: dict) -> FindingEvidence:
    """The typed view of a ``kind`` finding's ``evidence``; ``ValueError`` naming the key when it does not fit.

    Strict as the decoder is (no text becomes a number), so a finding reads the same made here or read back.
    """
    view = EVIDENCE_VIEWS.get(kind, FindingEvidence)
    try:
        return view.model_validate(evidence, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"evidence.{where} of a {kind} finding: {first['msg']}") from None
