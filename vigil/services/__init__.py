"""Long-running processes that wire the layers together (they sit on top, beside the CLI)."""
