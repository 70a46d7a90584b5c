"""Analytics over the history: rollup tables fed by materialized views, and views.

Five rollups are filled by materialized views as the sink inserts, so they
outlive the raw telemetry's TTL and answer in milliseconds:

``incident_rollup``
    one row per incident (after merges), from every version of its alerts:
    kind, worst severity, first onset, first detection, resolution, subject,
    XID code and fail-slow size (from the evidence), first detector.
``job_steps``
    one row per executed training step of a job (from ``iteration_steps``, or
    rank 0's ``iterations``): what ETTR is computed from.
``node_days``
    first and last heartbeat of each node per day: the exposure (node-days in
    service) that failure rates are divided by.
``incident_slowdowns``
    per incident and job it slowed down: the largest relative slowdown and its
    class, from the alerts' ``slowdowns`` and from their ``fail_slow``
    evidence, whatever the incident's root (a throttled GPU, a congested link,
    a straggler or the fail-slow itself).
``job_step_blocks``
    per job and block of 1024 steps (fed from ``job_steps``): rows, distinct
    steps, summed duration, first/last start and end. ETTR adds up the blocks
    that lie inside its window with one execution per step, and reads single
    steps only for the rest (a few blocks per job: the window's edges and the
    steps re-run after a restart) instead of grouping every step.

Every aggregate in the first three is idempotent (min, max, argMin, argMax; the
step table is keyed by execution), so a row inserted twice (a backfill that
overlaps the view, a replay) never counts twice. ``job_step_blocks`` sums, but
a block where a row came twice has more rows than distinct steps, and is then
read step by step like a block with re-run steps: still exact, only slower.

The views on top are plain SQL, most of them parameterized by a window
``(since, until)``: ``SELECT * FROM vigil.ettr(since='2026-01-01', until=now64())``.

``incidents``
    one row per incident with ``domain`` (user_code / system_software /
    hardware / network), ``failure_class`` (fail_stop / fail_slow / warning /
    vigil) and ``detection_latency_s``.
``incident_taxonomy(since, until)``
    incidents by domain, kind, severity and XID code.
``job_runs``
    each job's span, GPUs and nodes from its published states (``job_states``)
    and its steps. The span starts at the first ``running`` state or the first
    step, whichever is first, and ends at the terminal state (``completed``,
    ``failed``, ``cancelled``); a job whose last state is not terminal still
    holds its GPUs, so its span runs to now; a job that never published a
    state is known by its steps only and spans its first to its last step.
``ettr(since, until)``
    Meta's effective training time ratio per job: productive time (each step's
    last execution; executions later redone after a restart are lost work) over
    available time (the job's span), both clipped to the window. A job that
    died and was failed by its scheduler later, or still holds its GPUs, has
    the time since its last step counted as available and unproductive.
``run_ettr(since, until)``
    the same per training run (the jobs sharing ``run``, a chain under a
    time limit): the jobs' times added up, and ``gap_s``, the time between
    them (queued for the next job), apart: unavailable, not a failure.
``mttf_by_size(since, until)`` / ``mttf_projection(since, until)``
    failures (fail-stop incidents of the job, or of a node it ran on) per
    GPU-count bucket with the observed MTTF; the fleet failure rate per
    node-day (Poisson maximum likelihood: failures / node-days of job runtime)
    and the MTTF it predicts for each bucket and for 1k-100k GPUs.
``mttr_by_action(since, until)``
    detection -> recovery per action; recovered is the first ``succeeded``
    action result of a decision answering the incident, or the incident's
    resolution, whichever came first.
``detection_latency(since, until)``
    detection - onset per first detector: count, mean, p50, p90, p99, max.
``failslow_lost(since, until)``
    time lost to fail-slows per job: slowed time x rel/(1 + rel), where rel
    is the relative slowdown the change-point detector measured for the job
    (``incident_slowdowns``) and the slowed time runs from the incident's
    onset to its resolution, clipped to the window and to the job's span.
``lemon_nodes(since, until)``
    fail-stop incidents per node (user-code failures excluded) against the
    fleet rate times the node's days in service: the Poisson tail probability
    P(X >= k); a lemon is a node with k >= 2 whose probability, corrected for
    the number of nodes (Bonferroni), is below 1%.

The package, by what each module holds: :mod:`.taxonomy` (failure classes
and domains of incident kinds and XID codes), :mod:`.rollups` (the rollup
tables and the materialized views that feed them), :mod:`.views` (the SQL
of each view), :mod:`.migrate` (creating all of them, and the windowed
views' arguments); :mod:`.sql` holds the SQL fragments they share.
"""

from __future__ import annotations

from vigil.streams.analytics.migrate import migrate_analytics, window_args
from vigil.streams.analytics.rollups import ROLLUPS, STEP_BLOCK, Rollup
from vigil.streams.analytics.taxonomy import (DOMAIN_OF_KIND, FAIL_SLOW_KINDS, VIGIL_KINDS, WARNING_KINDS,
                                              XID_SYSTEM_SOFTWARE, XID_USER_CODE)
from vigil.streams.analytics.views import LEMON_ALPHA, PROJECTION_GPUS, VIEWS, WINDOWED

__all__ = ["DOMAIN_OF_KIND", "FAIL_SLOW_KINDS", "LEMON_ALPHA", "PROJECTION_GPUS", "ROLLUPS", "Rollup", "STEP_BLOCK",
           "VIEWS", "VIGIL_KINDS", "WARNING_KINDS", "WINDOWED", "XID_SYSTEM_SOFTWARE", "XID_USER_CODE",
           "migrate_analytics", "window_args"]
