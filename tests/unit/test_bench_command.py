"""The ``command`` a benchmark writes into its JSON reproduces the run it describes.

For every ``vigil bench`` command: the command line is parsed by the real
``vigil`` CLI, whose call into the benchmark is captured (nothing is
measured), and must hand ``run`` exactly the arguments the command was made
from. When an argument the CLI does not take was changed, the command is the
Python call instead, never a CLI line that would measure something else. The
module-level commands (``python -m vigil.bench.localization``, ``python -m
vigil.bench.pipeline inprocess|merge``) are parsed back by their own parsers.
Every benchmark's load average before and after is checked where the
benchmark runs (tests/integration, and the tiny planners run in
test_planners.py); here, the writers that need no broker.
"""

from __future__ import annotations

import inspect
import json
import shlex
from typing import Any

import pytest
from typer.testing import CliRunner

import vigil.bench.detectors as detectors
import vigil.bench.fuzz as fuzz
import vigil.bench.history as history
import vigil.bench.hooks as hooks
import vigil.bench.localization as localization
import vigil.bench.pipeline as pipeline
import vigil.bench.pipeline.cli as pipeline_cli
import vigil.bench.planners as planners
import vigil.bench.policies as policies
import vigil.bench.scenarios as scenarios
from vigil.bench.command import reproducing_command
from vigil.cli import app

#: every ``vigil bench`` command: its module, and arguments that differ from run()'s defaults
BENCHES = {
    "planners": (planners, {"repeats": 3, "seed": 2, "quality_seeds": 4}),
    "policies": (policies, {"trace": "trace-b", "gpus": 256, "seed": 3, "scale": False, "sweep_seeds": 0}),
    "history": (history, {"telemetry_rows": 20_000, "incidents": 2_000, "sink_events": 3_000, "repeats": 1,
                          "sink_seconds": 4.5}),
    "fuzz": (fuzz, {"messages": 500, "malformed": 0.5, "seed": 1}),
    "detectors": (detectors, {"n_traces": 20, "tuning_seeds": (1,), "evaluation_seeds": (4, 5),
                              "n_out_of_family": 3, "general": False, "n_general_per_family": 6}),
    "pipeline": (pipeline, {"load_gpus": (100, 200), "workers": 2, "faults_per_kind": 3, "throughput_workers": (),
                            "throughput_gpus": 500, "throughput_seconds": 10.5, "seed": 4,
                            "stop_at_first_miss": False}),
    "hooks": (hooks, {"steps": 200, "block": 10, "acf_steps": 60, "world": 4, "pin": False, "real_steps": 40,
                      "real_block": 3, "real_hidden": 16, "real_batch": 8, "seed": 2, "agent_seconds": 3.5}),
    "scenarios": (scenarios, {"names": tuple(scenarios.SCENARIOS)[:2]}),
}


class _Captured(Exception):
    """Raised by the stand-in for run() once it has the arguments: nothing runs."""


def _defaults(run: Any) -> dict[str, Any]:
    return {k: p.default for k, p in inspect.signature(run).parameters.items() if k != "progress"}


def _plain(value: Any) -> Any:
    """A tuple and a list of the same values are the same argument (the CLI parses lists)."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def test_every_bench_command_is_checked():
    import typer

    assert set(typer.main.get_command(app).commands["bench"].commands) == set(BENCHES)


@pytest.mark.parametrize("bench", sorted(BENCHES))
@pytest.mark.parametrize("changed", [False, True], ids=["defaults", "changed"])
def test_the_cli_line_hands_run_the_arguments_it_was_made_from(bench, changed, monkeypatch, tmp_path):
    module, values = BENCHES[bench]
    monkeypatch.delenv("VIGIL_KAFKA_BOOTSTRAP", raising=False)
    defaults = _defaults(module.run)
    arguments = {**defaults, "json_path": str(tmp_path / "out dir" / f"{bench}.json"), **(values if changed else {})}
    command = reproducing_command(module.run, arguments, f"vigil bench {bench}", module.CLI_OPTIONS)
    argv = shlex.split(command)
    assert argv[:3] == ["vigil", "bench", bench]

    seen: dict[str, Any] = {}
    names = [k for k in inspect.signature(module.run).parameters if k != "json_path"]

    def fake_run(json_path, *args, **kwargs):
        seen.update(zip(names, args), **kwargs, json_path=json_path)
        raise _Captured

    monkeypatch.setattr(module, "run", fake_run)
    done = CliRunner().invoke(app, argv[1:])
    assert isinstance(done.exception, _Captured), done.output
    seen.pop("progress", None)
    on_cli = {k for k in arguments if k == "json_path" or k in module.CLI_OPTIONS}
    assert {k: _plain(v) for k, v in seen.items() if k in on_cli} == {k: _plain(arguments[k]) for k in on_cli}
    # what else the CLI hands run() is run()'s default: the line would not show it
    assert {k: v for k, v in seen.items() if k not in on_cli} == {k: defaults[k] for k in seen if k not in on_cli}


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_the_cli_defaults_are_runs_defaults(bench):
    """Else a line written with run()'s defaults spelled out would still reproduce it, but the bare
    command users type would measure something else than the documented run."""
    import typer

    module, _ = BENCHES[bench]
    command = typer.main.get_command(app).commands["bench"].commands[bench]
    cli = {p.name: p for p in command.params}
    assert set(cli) == {"json_path", *module.CLI_OPTIONS}
    for name, option in module.CLI_OPTIONS.items():
        assert "/".join(cli[name].opts + cli[name].secondary_opts) == option.removesuffix("..."), name
        default = inspect.signature(module.run).parameters[name].default
        if isinstance(default, tuple) and not option.endswith("..."):  # the CLI takes it comma-separated
            default = ",".join(map(str, default))
        assert cli[name].default == default, name


def test_the_fuzz_line_spells_out_what_changed():
    module, values = BENCHES["fuzz"]
    line = reproducing_command(module.run, {**_defaults(module.run), "json_path": "f.json", **values},
                               "vigil bench fuzz", module.CLI_OPTIONS)
    assert line == "vigil bench fuzz --json f.json --messages 500 --malformed 0.5 --seed 1"


def test_sequences_are_written_as_the_cli_reads_them():
    pipe = reproducing_command(pipeline.run, {**_defaults(pipeline.run), **BENCHES["pipeline"][1]},
                               "vigil bench pipeline", pipeline.CLI_OPTIONS)
    assert "--load-gpus 100,200 " in pipe and "--throughput-workers '' " in pipe and pipe.endswith("--keep-going")
    names = BENCHES["scenarios"][1]["names"]
    scen = reproducing_command(scenarios.run, {"json_path": "s.json", "names": names}, "vigil bench scenarios",
                               scenarios.CLI_OPTIONS)
    assert scen == "vigil bench scenarios --json s.json " + " ".join(f"--only {n}" for n in names)
    assert reproducing_command(scenarios.run, {"json_path": "s.json"}, "vigil bench scenarios",
                               scenarios.CLI_OPTIONS) == "vigil bench scenarios --json s.json"  # all of them


@pytest.mark.parametrize("bench,argument", [("hooks", {"bootstrap": "other:9092"}), ("hooks", {"hidden": 8}),
                                            ("scenarios", {"bootstrap": "other:9092"}),
                                            ("detectors", {"detectors": ("bocd",)})])
def test_an_argument_off_the_cli_gives_the_python_call(bench, argument):
    module, _ = BENCHES[bench]
    args = {**_defaults(module.run), "json_path": "x.json", **argument}
    command = reproducing_command(module.run, args, f"vigil bench {bench}", module.CLI_OPTIONS)
    assert command.startswith(f"python -c 'from {module.__name__} import run; run(")
    seen = {}
    eval(compile(shlex.split(command)[2].split("; ", 1)[1], "<command>", "eval"), {"run": lambda **kw: seen.update(kw)})
    assert seen == args


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


@pytest.mark.parametrize("argv, written", [
    ([], "bench/results/scenarios.json"),
    (["--only", "rank_killed"], "bench/results/scenarios-only.json"),
    (["--only", "rank_killed", "--json", "x.json"], "x.json"),
])
def test_scenarios_with_only_never_overwrite_the_committed_results(monkeypatch, argv, written):
    """A run of some scenarios writes apart from the full suite's committed JSON unless told where."""
    import subprocess
    from pathlib import Path

    import vigil.bench.scenarios as scenarios

    seen = {}

    def fake_run(json_path, names=None, **kw):
        seen.update(json_path=json_path, names=names)
        return {"scenarios": {}, "passed": 0, "total": 0, "false_pages": 0, "missed": 0, "wall_s": 0.0}

    monkeypatch.setattr(scenarios, "run", fake_run)
    result = CliRunner().invoke(app, ["bench", "scenarios", *argv])
    assert result.exit_code == 0, result.output
    assert seen["json_path"] == written and written in result.output.replace("\n", "")
    if "--only" in argv and "--json" not in argv:  # and git leaves the partial results out
        root = Path(__file__).resolve().parents[2]
        ignored = subprocess.run(["git", "check-ignore", "-q", written], cwd=root)
        assert ignored.returncode == 0


# -- the module-level commands -------------------------------------------------------------------------------------

def test_the_localization_line_reruns_what_it_measured_and_records_the_load(monkeypatch, tmp_path):
    calls = []

    def fake_score(seed, n_cases, one_reporter_cases):
        calls.append((seed, n_cases, one_reporter_cases))
        return {k: None for k in ("accuracy", "accuracy_hooks", "by_class", "by_class_hooks", "bubble_cases",
                                  "all_targets_met", "seconds")}

    monkeypatch.setattr(localization, "score_localizer", fake_score)
    out = tmp_path / "a dir" / "loc.json"
    localization.main(["--json", str(out), "--seed", "3", "--cases", "7", "--one-reporter-cases", "5"])
    written = json.loads(out.read_text())
    assert all(len(written[k]) == 3 for k in ("loadavg_before", "loadavg_after"))
    argv = shlex.split(written["command"])
    assert argv[:3] == ["python", "-m", "vigil.bench.localization"]
    localization.main(argv[3:])
    assert calls == [(3, 7, 5), (3, 7, 5)]


def test_the_inprocess_line_reruns_what_it_measured(monkeypatch, tmp_path):
    real = pipeline.inprocess
    args = {**_defaults(real), "gpus": 900, "seconds": 3.5, "warmup_s": 2.0, "repeats": 2,
            "profile_lines": 4, "json_path": str(tmp_path / "a b.json")}
    command = reproducing_command(real, args, "python -m vigil.bench.pipeline inprocess",
                                  pipeline.INPROCESS_OPTIONS)
    argv = shlex.split(command)
    assert argv[:4] == ["python", "-m", "vigil.bench.pipeline", "inprocess"]
    seen = {}

    def fake(gpus, seconds, **kw):
        seen.update(kw, gpus=gpus, seconds=seconds)
        return {}

    monkeypatch.setattr(pipeline_cli, "inprocess", fake)  # the name the command line's main calls
    pipeline.main(argv[3:])
    assert seen == {k: v for k, v in args.items() if k != "seed"}
    assert reproducing_command(real, {**args, "seed": 2}, "python -m vigil.bench.pipeline inprocess",
                               pipeline.INPROCESS_OPTIONS).startswith("python -c ")  # no option for the seed


def test_a_merged_pipeline_result_names_its_parts_its_merge_and_the_load(tmp_path):
    parts = []
    for i, load in enumerate(([0.5] * 3, [0.7] * 3)):
        p = tmp_path / f"part {i}.json"
        p.write_text(json.dumps({"command": f"vigil bench pipeline --seed {i}", "wall_s": 1.0, "capacity": [],
                                 "throughput": {}, "machine": {"load_before": load, "load_after": [1.0] * 3}}))
        parts.append(str(p))
    out = tmp_path / "merged.json"
    argv = ["merge", *parts, "--json", str(out), "--note", "two parts"]
    pipeline.main(argv)
    merged = json.loads(out.read_text())
    assert merged["command"] == ["vigil bench pipeline --seed 0", "vigil bench pipeline --seed 1"]
    assert shlex.split(merged["merge_command"]) == ["python", "-m", "vigil.bench.pipeline", *argv]
    assert merged["machine"]["load_before"] == [0.5] * 3 and merged["machine"]["load_after"] == [1.0] * 3


def test_the_scenarios_run_builds_its_command_from_its_arguments_alone(monkeypatch):
    """run() imports what it needs before building its command: those names are not arguments (the CLI
    crashed with 'arguments [...] are not parameters of run' before it started a broker)."""
    import vigil.bench.scenarios as scenarios
    import vigil.broker

    class Started(Exception):
        pass

    def no_broker(*_a, **_k):
        raise Started

    monkeypatch.setattr(vigil.broker, "find_tansu", no_broker)
    with pytest.raises(Started):  # got as far as starting the broker: the command was built
        scenarios.run(None, ("normal_completion",))
