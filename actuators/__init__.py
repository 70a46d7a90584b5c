"""Actuators: executors for decisions and the planners (later issue)."""
