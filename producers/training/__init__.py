"""Training-side hooks: step timings, collective instrumentation, exception capture, control channel.

See :mod:`vigil.producers.training.monitor` for the API, :mod:`vigil.producers.training.control`
for the control channel's transport, and :mod:`vigil.producers.training.batching`
for the node-local batcher the ranks send to.
"""

from vigil.producers.training.batching import NodeBatcher, default_hooks_socket
from vigil.producers.training.control import Command, ControlChannel, ControlError, control_path, send_command
from vigil.producers.training.exceptions import classify_exception, classify_text
from vigil.producers.training.monitor import COLLECTIVES, StepContext, TrainingMonitor
from vigil.producers.training.wire import CallbackSink, PublisherSink, Sink, UnixDatagramSink, records_to_events

__all__ = [
    "NodeBatcher", "default_hooks_socket", "Command", "ControlChannel", "ControlError", "control_path",
    "send_command", "classify_exception", "classify_text", "COLLECTIVES", "StepContext", "TrainingMonitor",
    "CallbackSink", "PublisherSink", "Sink", "UnixDatagramSink", "records_to_events",
]
