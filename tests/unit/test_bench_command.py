"""The ``command`` a benchmark writes into its JSON reproduces the run it describes.

For the planners, policies and history benchmarks: the command line is parsed
by the real ``vigil`` CLI, whose call into the benchmark is captured (nothing
is measured), and must hand ``run`` exactly the arguments the command was
made from. When an argument the CLI does not take was changed, the command
is the Python call instead, never a CLI line that would measure something
else.
"""

from __future__ import annotations

import inspect
import shlex
from typing import Any

import pytest
from typer.testing import CliRunner

import vigil.bench.fuzz as fuzz
import vigil.bench.history as history
import vigil.bench.planners as planners
import vigil.bench.policies as policies
from vigil.bench.command import reproducing_command
from vigil.cli import app

BENCHES = {
    "planners": (planners, {"repeats": 3, "seed": 2, "quality_seeds": 4}),
    "policies": (policies, {"trace": "trace-b", "gpus": 256, "seed": 3, "scale": False, "sweep_seeds": 0}),
    "history": (history, {"telemetry_rows": 20_000, "incidents": 2_000, "sink_events": 3_000, "repeats": 1,
                          "sink_seconds": 4.5}),
}
#: benchmarks whose CLI prints its own table (no format_table to stub): their options and defaults are checked
ALL_BENCHES = {**BENCHES, "fuzz": (fuzz, {"messages": 500, "malformed": 0.5, "seed": 1})}


def _defaults(run: Any) -> dict[str, Any]:
    return {k: p.default for k, p in inspect.signature(run).parameters.items() if k != "progress"}


@pytest.mark.parametrize("bench", sorted(BENCHES))
@pytest.mark.parametrize("changed", [False, True], ids=["defaults", "changed"])
def test_the_cli_line_hands_run_the_arguments_it_was_made_from(bench, changed, monkeypatch, tmp_path):
    module, values = BENCHES[bench]
    arguments = {**_defaults(module.run), "json_path": str(tmp_path / "out dir" / f"{bench}.json"),
                 **(values if changed else {})}
    command = reproducing_command(module.run, arguments, f"vigil bench {bench}", module.CLI_OPTIONS)
    argv = shlex.split(command)
    assert argv[:3] == ["vigil", "bench", bench]

    seen: dict[str, Any] = {}

    def fake_run(json_path, **kwargs):
        seen.update(kwargs, json_path=json_path)
        return {"targets": {}}

    monkeypatch.setattr(module, "run", fake_run)
    monkeypatch.setattr(module, "format_table", lambda result: [])
    done = CliRunner().invoke(app, argv[1:])
    assert done.exit_code == 0, done.output
    seen.pop("progress", None)
    assert seen == {k: v for k, v in arguments.items() if k == "json_path" or k in module.CLI_OPTIONS}


@pytest.mark.parametrize("bench", sorted(ALL_BENCHES))
def test_the_cli_defaults_are_runs_defaults(bench):
    """Else a line written with run()'s defaults spelled out would still reproduce it, but the bare
    command users type would measure something else than the documented run."""
    import typer

    module, _ = ALL_BENCHES[bench]
    command = typer.main.get_command(app).commands["bench"].commands[bench]
    cli = {p.name: p for p in command.params}
    assert set(cli) == {"json_path", *module.CLI_OPTIONS}
    for name, option in module.CLI_OPTIONS.items():
        assert "/".join(cli[name].opts + cli[name].secondary_opts) == option
        assert cli[name].default == inspect.signature(module.run).parameters[name].default, name


def test_the_fuzz_line_spells_out_what_changed():
    module, values = ALL_BENCHES["fuzz"]
    line = reproducing_command(module.run, {**_defaults(module.run), "json_path": "f.json", **values},
                               "vigil bench fuzz", module.CLI_OPTIONS)
    assert line == "vigil bench fuzz --json f.json --messages 500 --malformed 0.5 --seed 1"


def test_an_argument_the_cli_does_not_take_gives_the_python_call():
    args = {**_defaults(planners.run), "json_path": "p.json", "microbatch_headline": 16}
    command = reproducing_command(planners.run, args, "vigil bench planners", planners.CLI_OPTIONS)
    assert command.startswith("python -c ")
    code = shlex.split(command)[2]
    assert code.startswith("from vigil.bench.planners import run; run(")
    call = compile(code.split("; ", 1)[1], "<command>", "eval")  # a valid Python call
    seen = {}
    eval(call, {"run": lambda **kw: seen.update(kw)})
    assert seen == args


def test_a_list_for_a_tuple_default_is_still_the_default():
    args = {**_defaults(planners.run), "microbatch_groups": [64, 128, 256, 512, 1024]}
    assert reproducing_command(planners.run, args, "vigil bench planners", planners.CLI_OPTIONS).startswith("vigil")


def test_a_misdeclared_option_or_argument_is_an_error():
    with pytest.raises(ValueError, match="not parameters"):
        reproducing_command(planners.run, {"nope": 1}, "vigil bench planners", planners.CLI_OPTIONS)
    with pytest.raises(ValueError, match="flag"):
        reproducing_command(policies.run, {"scale": False}, "vigil bench policies", {"scale": "--scale"})
