"""What the tests that run ``tests/fixtures/resilient_train.py`` under the real agent share: the ranks' own
progress files (the ground truth of where the job is) and the loop's outputs as they arrive."""

from __future__ import annotations

from pathlib import Path

from vigil.schemas import ActionResult, Alert, Decision, decode
from vigil.streams.kafka import reader

FIXTURE = Path(__file__).parent.parent / "fixtures" / "resilient_train.py"


def progress(ckpt: Path, ranks: int) -> dict[int, tuple[int, int]]:
    """rank -> (step, restart count) as the ranks last wrote it (a file caught mid-rewrite is left out)."""
    out = {}
    for r in range(ranks):
        try:
            step, restarts = (ckpt / f"progress.rank{r}").read_text().split()
            out[r] = (int(step), int(restarts))
        except (FileNotFoundError, ValueError):
            pass
    return out


class LoopOutputs:
    """The alerts, decisions and action results on the stack's topics, appended as :meth:`poll` reads them."""

    def __init__(self, config) -> None:
        self._reader = reader(config.kafka_conf(), [config.topic(t) for t in ("alert", "decision", "action_result")])
        self.alerts: list[Alert] = []
        self.decisions: list[Decision] = []
        self.results: list[ActionResult] = []

    def poll(self) -> None:
        lists = {Alert: self.alerts, Decision: self.decisions, ActionResult: self.results}
        for msg in self._reader.consume(200, timeout=0.1):
            if not msg.error():
                for ev in decode(msg.value()).events:
                    lists[type(ev)].append(ev)

    def close(self) -> None:
        self._reader.close()
