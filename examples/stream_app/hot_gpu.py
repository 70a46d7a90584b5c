"""Example standalone stream app: a GPU hotter than a limit, written with vigil.sdk.

Run it next to a vigil stack (same VIGIL_* environment):

    python examples/stream_app/hot_gpu.py --limit 90

Its findings go to the findings topic; vigil's correlator turns them into
incidents and alerts like any built-in detector's.
"""

from __future__ import annotations

import argparse

from vigil.sdk import StreamApp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=90.0, help="temperature limit in degrees Celsius")
    parser.add_argument("--max-events", type=int, default=None, help="stop after this many events (tests)")
    args = parser.parse_args()

    app = StreamApp("hot-gpu", consumes=["gpu_telemetry"])

    @app.handler
    def on_gpu(event, ctx):
        if event.temperature_c is not None and event.temperature_c > args.limit:
            ctx.raise_finding("gpu_too_hot", severity=3, node=event.source.node, gpu=event.source.gpu,
                              onset=event.event_time,
                              evidence={"temperature_c": event.temperature_c, "limit_c": args.limit})

    app.run(max_events=args.max_events)


if __name__ == "__main__":
    main()
