"""Every metric a vigil process exports, by name with its labels, and which dead letters are decode errors."""

from __future__ import annotations


#: Every metric vigil defines (the client library adds ``_total`` to counters), with its labels.
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    # every process
    "vigil_build_info": ("component", "version"),
    # consumers: worker, history sink, actuator, notify
    "vigil_consumer_lag_messages": ("topic", "partition"),
    # worker
    "vigil_events_consumed_total": ("topic",),
    "vigil_findings_total": ("detector", "status"),
    "vigil_alerts_total": ("kind", "severity", "status"),
    "vigil_decisions_total": ("action",),
    "vigil_dead_letters_total": ("reason", "topic"),
    "vigil_decode_errors_total": ("reason", "topic"),
    "vigil_open_incidents": ("severity",),
    "vigil_tracked_subjects": ("per",),
    "vigil_worker_assigned_partitions": (),
    "vigil_worker_replaying_partitions": (),
    "vigil_worker_correlating": (),
    "vigil_detector_update_seconds": ("detector",),
    "vigil_detector_tick_seconds": ("detector",),
    # history sink (vigil up)
    "vigil_sink_messages_total": (),
    "vigil_sink_rows_inserted_total": (),
    "vigil_sink_duplicates_total": (),
    "vigil_sink_dead_letters_total": (),
    "vigil_sink_batches_total": (),
    "vigil_sink_retries_total": (),
    "vigil_sink_errors_total": ("kind",),
    "vigil_sink_running": (),
    "vigil_embedded_broker_restarts_total": (),
    # actuator (vigil actuate, vigil agent --actuate)
    "vigil_actions_total": ("action", "state", "backend"),
    "vigil_actuator_decisions_total": (),
    "vigil_actuator_circuit_open": (),
    # agent and scrape: the publisher with its spool
    "vigil_publisher_messages_delivered_total": (),
    "vigil_publisher_failures_total": (),
    "vigil_publisher_spooled_messages_total": (),
    "vigil_publisher_replayed_messages_total": (),
    "vigil_publisher_dropped_events_total": (),
    "vigil_publisher_outages_total": (),
    "vigil_publisher_spool_bytes": (),
    "vigil_publisher_spool_messages": (),
    "vigil_publisher_spooling": (),
    "vigil_agent_collector_runs_total": ("collector",),
    "vigil_agent_collector_failures_total": ("collector",),
    # notify
    "vigil_notify_alerts_total": (),
    "vigil_notify_deliveries_total": ("outcome",),
    "vigil_notify_dead_letters_total": (),
}

#: Dead-letter reasons that are not a message failing to decode (an event refused by a consumer or
#: the store, a sink's own failure, a message the broker could not hand over); every other reason is
#: a decode error (:class:`vigil.schemas.DecodeError`'s: not_json, invalid, unknown_event_type, ...).
NOT_DECODE_ERRORS = frozenset({"refused", "store_refused", "sink_error", "consume_error", "notify_failed",
                               "notify_retries_exhausted"})
