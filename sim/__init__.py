"""Simulated clusters: telemetry generators, labelled traces, and weeks of cluster time.

- :mod:`~vigil.sim.simulator`: minutes of a cluster's telemetry, event by event (the demo, the Kafka benchmarks);
- :mod:`~vigil.sim.feed`: ``vigil sim``, that simulator played into a running stack with a small fault vocabulary;
- :mod:`~vigil.sim.traces`: labelled iteration-time traces for the change-point benchmark;
- :mod:`~vigil.sim.rank_traces`: per-rank step records with a known straggler, for the localizer;
- :mod:`~vigil.sim.changepoints`: labelled series of many kinds, with simulated annotators (the general change-point benchmark);
- :mod:`~vigil.sim.failslow_cases`: fail-slow cases outside the traces' family (ramps, flapping, benign shifts...);
- :mod:`~vigil.sim.rank_traces` and :mod:`~vigil.sim.hook_replay`: the same cases replayed through the real training hooks;
- :mod:`~vigil.sim.fake_cuda`: a fake CUDA device whose work completes after the call returns (GPU timing tests on CPU);
- :mod:`~vigil.sim.load`: a large cluster's steady telemetry at real rates, with faults (the pipeline benchmark),
  its jobs from :mod:`~vigil.sim.job_mix` and its message bytes from :mod:`~vigil.sim.wire`;
- :mod:`~vigil.sim.clustersim`: weeks of a whole cluster under each recovery policy.

The simulator sits on top of every other layer: it runs the live detectors,
correlator and decision engine in process, and its actuator is a backend
behind the real executor.
"""
