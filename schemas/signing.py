"""Signed decisions: the decision engine's publisher signs, actuators verify before acting.

Anyone who can write ``<prefix>.decisions`` could otherwise make an actuator
drain nodes or restart jobs. A decision carries ``signature``:

    ``v1:<key id>:<mac>``, mac = base64url (unpadded) of
    HMAC-SHA256(key, ``b"vigil-decision-v1\\n" + key id + b"\\n" + canonical``)

where ``canonical`` is the decision without its signature as JSON: the
model's JSON-mode dump (None fields left out), keys sorted, no whitespace,
UTF-8. Everything an actuator acts on is covered: the id, the idempotency
key, the action, the target, the plan, the reason and the time (so a stale
decision cannot be made fresh). The key id names which key signed it, so
keys can rotate: publish with the new key while actuators still accept the
old one, then retire it. Replays of a signed decision are the actuator's to
refuse (its ledger knows every decision id it has seen, and where).

Keys are secrets shared by the decision engine and the actuators (the
``VIGIL_DECISION_KEYS`` setting: ``{"key id": "secret", ...}``); nothing here
reads the environment.

>>> import uuid
>>> from datetime import datetime, timezone
>>> from vigil.schemas import Decision, Subject
>>> ring = Keyring({"k1": b"0123456789abcdef0123456789abcdef"}, signing_key="k1")
>>> d = Decision(event_time=datetime(2026, 3, 1, tzinfo=timezone.utc), decision_id=uuid.UUID(int=1),
...              idempotency_key="k", action="isolate_node", target=Subject(node="n1"), reason="xid 79")
>>> signed = ring.sign(d)
>>> signed.signature.startswith("v1:k1:"), ring.check(signed)
(True, None)
>>> ring.check(signed.model_copy(update={"target": Subject(node="n2")}))
'bad signature (the decision was altered, or signed with another key k1)'
>>> ring.check(d)
'unsigned'
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Mapping

from vigil.schemas.events import Decision

__all__ = ["Keyring", "canonical", "signature_of", "MIN_KEY_BYTES"]

#: Shortest key accepted: 128 bits.
MIN_KEY_BYTES = 16
_DOMAIN = b"vigil-decision-v1\n"
_SIGNATURE = re.compile(r"v1:([A-Za-z0-9_.-]{1,64}):([A-Za-z0-9_-]{43})")
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def canonical(decision: Decision) -> bytes:
    """The bytes a decision's signature covers (everything but the signature)."""
    body = decision.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def signature_of(decision: Decision, key_id: str, key: bytes) -> str:
    """``v1:<key id>:<mac>`` for ``decision`` under ``key``."""
    mac = hmac.new(key, _DOMAIN + key_id.encode() + b"\n" + canonical(decision), hashlib.sha256).digest()
    return f"v1:{key_id}:{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


@dataclass(frozen=True)
class Keyring:
    """Decision keys by id; ``signing_key`` names the one that signs (None: this side only verifies).

    ``allow_unsigned``: accept decisions without a signature (a development
    stack, said loudly by whoever sets it); a signature that is there must
    still be valid.
    """

    keys: Mapping[str, bytes] = field(default_factory=dict)
    signing_key: str | None = None
    allow_unsigned: bool = False

    def __post_init__(self) -> None:
        for kid, key in self.keys.items():
            if not _KEY_ID.fullmatch(kid):
                raise ValueError(f"decision key id {kid[:80]!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(f"decision key {kid!r} is {len(key)} bytes; at least {MIN_KEY_BYTES} "
                                 "(e.g. `openssl rand -base64 32`)")
        if self.signing_key is not None and self.signing_key not in self.keys:
            raise ValueError(f"the signing key {self.signing_key!r} is not among the decision keys "
                             f"({', '.join(sorted(self.keys)) or 'none'})")

    def __repr__(self) -> str:  # never the keys themselves
        return (f"Keyring(key_ids={sorted(self.keys)}, signing_key={self.signing_key!r}, "
                f"allow_unsigned={self.allow_unsigned})")

    @property
    def can_sign(self) -> bool:
        return self.signing_key is not None

    def sign(self, decision: Decision) -> Decision:
        """``decision`` with its signature (unchanged when this keyring has no signing key)."""
        if self.signing_key is None:
            return decision
        sig = signature_of(decision, self.signing_key, self.keys[self.signing_key])
        return decision.model_copy(update={"signature": sig})

    def check(self, decision: Decision) -> str | None:
        """None when ``decision`` may be acted on as far as its signature goes, else why not."""
        sig = decision.signature
        if sig is None:
            return None if self.allow_unsigned else "unsigned"
        match = _SIGNATURE.fullmatch(sig)
        if match is None:
            return "malformed signature"
        kid = match.group(1)
        key = self.keys.get(kid)
        if key is None:
            return f"signed with an unknown key id {kid!r} (known: {', '.join(sorted(self.keys)) or 'none'})"
        if not hmac.compare_digest(signature_of(decision, kid, key), sig):
            return f"bad signature (the decision was altered, or signed with another key {kid})"
        return None
