"""What every long-running command does first: log to stderr, read the VIGIL_* settings or say what is wrong."""

from __future__ import annotations

import logging

import typer

from vigil.settings import Settings


def settings_and_logging(log_level: str, default: int = logging.WARNING) -> Settings:
    """Configure logging at ``log_level`` and return the settings; exit 2 naming a bad variable."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), default),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return Settings()
    except Exception as exc:  # pydantic's ValidationError names the variable
        typer.echo(f"error: invalid VIGIL_* setting: {exc}", err=True)
        raise typer.Exit(2) from None
