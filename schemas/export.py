"""Export the JSON Schema of every event; the checked-in copy lives in schemas/json/."""

from __future__ import annotations

import json
from pathlib import Path

from vigil.schemas.events import EVENT_TYPES

#: Where the checked-in schemas live; a test fails when they drift from the models.
CHECKED_IN = Path(__file__).parent / "json"


def json_schemas() -> dict[str, str]:
    """event_type -> JSON Schema text (stable formatting, so diffs are readable)."""
    return {
        event_type: json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"
        for event_type, model in EVENT_TYPES.items()
    }


def export_json_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for event_type, text in json_schemas().items():
        path = directory / f"{event_type}.json"
        path.write_text(text)
        written.append(path)
    return written
