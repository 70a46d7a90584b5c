"""Stream apps: detection workers, the history sink, (later) the decision engine."""
