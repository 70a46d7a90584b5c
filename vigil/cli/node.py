"""``vigil node``: an operator says what became of a node (drained, in maintenance, repaired, unhealthy)."""

from __future__ import annotations

import enum
import getpass
import logging
import socket

import typer

from vigil.cli.common import app, console, fail


class Statement(str, enum.Enum):
    """What an operator may say of a node (the rest, joined/leaving/lost, is its agent's and the detectors')."""

    drained = "drained"
    maintenance = "maintenance"
    repaired = "repaired"
    unhealthy = "unhealthy"


@app.command("node")
def node(
    state: Statement = typer.Argument(..., metavar="STATE", help="What became of the node: drained, maintenance, "
                                      "repaired or unhealthy."),
    name: str = typer.Argument(..., metavar="NODE", help="The node's name, as its agent reports it."),
    reason: str = typer.Option("", "--reason", help="Why, for whoever reads the history (a ticket, the fault)."),
    cluster: str = typer.Option("default", help="Cluster name in the event (as the node's agent says it)."),
    timeout: float = typer.Option(30.0, min=1.0, help="Seconds to wait for the broker to take it."),
) -> None:
    """Publish an operator's word on a node to the node states topic (`<prefix>.state.nodes`).

    \b
    drained, maintenance: out of service on purpose; its silence pages
      no one (no node_lost), and it is no capacity for re-planning
    repaired: back from repair; no capacity until its agent starts and
      passes the node's health check (and says "joined")
    unhealthy: out of capacity until its agent's check passes

    Slurm and Kubernetes drains that `vigil actuate` carries out are announced
    by the actuator itself; this is for the ones a human makes (scontrol
    update state=drain, kubectl cordon, an RMA). The event says who sent it
    and from where. Goes to VIGIL_KAFKA_BOOTSTRAP, else the running `vigil
    up`'s broker. Exit 0 once the broker acknowledged it, 1 if it did not.
    """
    from pydantic import ValidationError

    from vigil.broker import StackError
    from vigil.cli.common import load_settings
    from vigil.producers.publisher import Publisher
    from vigil.schemas import NodeState, Source, topic_name
    from vigil.schemas.envelope import utcnow
    from vigil.stack import resolve_bootstrap

    who = f"vigil node by {_user()}@{socket.gethostname()}"
    try:
        event = NodeState(event_time=utcnow(), source=Source(cluster=cluster, node=name), state=state.value,
                          reason=f"{reason.strip() or 'no reason given'} ({who})"[-2000:])
    except ValidationError as exc:
        bad = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise typer.BadParameter(f"not a node state vigil accepts: {bad}") from None
    settings = load_settings()
    try:
        bootstrap = resolve_bootstrap(settings)
    except StackError as exc:
        fail(str(exc))
    logging.getLogger("vigil.producers.publisher").setLevel(logging.ERROR)
    publisher = Publisher({"bootstrap.servers": bootstrap, **settings.kafka_security()}, settings.topic_prefix,
                          message_timeout_ms=int(timeout * 1000))
    publisher.publish([event])
    left = publisher.close(timeout)
    topic = topic_name("node_state", settings.topic_prefix)
    if left or publisher.failed:
        fail(f"the broker at {bootstrap} did not take it within {timeout:g} s"
             + (f": {publisher.last_error}" if publisher.last_error is not None else ""))
    console.print(f"node {name}: {state.value} published to {topic} (event {event.event_id})", highlight=False)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        import os

        return str(os.getuid())
