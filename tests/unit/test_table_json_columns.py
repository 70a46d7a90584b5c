"""Nested models in JSON columns (an alert's slowdowns) are stored as JSON objects, not as their repr."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from vigil.schemas import Alert, Slowdown, Subject
from vigil.schemas.tables import column_values, rows

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)


def test_an_alerts_slowdowns_are_json_objects_a_query_can_read():
    slow = Slowdown(job="gpt", before_s=0.3, after_s=0.375, rel_change=0.25, slowdown_class="computation",
                    node="n10", gpu=2)
    alert = Alert(event_time=T0, incident_id=uuid.uuid4(), incident_version=2, status="update", severity=3,
                  kind="clock_below_peers", subject=Subject(node="n10", gpu=2), onset_time=T0, detection_time=T0,
                  detector="gpu_degradation", detector_version="1", jobs={"gpt": ["n10"]}, slowdowns=[slow])
    names, by_row = rows("alert", [alert])
    assert json.loads(by_row[0][names.index("slowdowns")]) == [slow.model_dump(mode="json")]
    names, by_column = column_values("alert", [alert])
    assert json.loads(by_column[names.index("slowdowns")][0]) == [slow.model_dump(mode="json")]
