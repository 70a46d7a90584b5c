"""Stream apps: the pure engine (engine/: detection, incidents, decisions), the Kafka worker, the history sink, notify."""
