"""vigil: the CLI and the wiring of the embedded stack."""
__version__ = "0.1.0"
