"""The two ways to add a detector, as a user would: an installed entry-point
plugin, and a standalone app written with vigil.sdk. Both run for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Producer

from vigil.schemas import Alert, GpuSamples, GpuTelemetry, Source, decode, encode_batch, from_seconds
from vigil.streams.kafka import reader
from tests.integration.conftest import WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_entry_point_plugin_and_sdk_app_raise_incidents(config, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(ROOT / "examples" / "detector_plugin")], check=True)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path  # the worker subprocess finds the plugin's entry point there
    try:
        worker = WorkerProcess(config, tmp_path / "w")
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
               VIGIL_STATE_DIR=str(tmp_path / "app"))
    app = subprocess.Popen([sys.executable, str(ROOT / "examples" / "stream_app" / "hot_gpu.py"), "--limit", "90"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    alerts: list[Alert] = []
    consumer = reader(config.kafka_conf(), [config.topic("alert")])
    try:
        worker.wait_ready()
        assert "loaded detector plugin power_cap" in worker.log.read_text()
        producer = Producer(config.kafka_conf())
        t0 = time.time()
        for i in range(5):
            # GPU 2 over its power cap from the first sample, GPU 5 hot from the third: the plugin's 3 samples in a
            # row and the app's hot one need the columns' samples too
            power = [800.0 if g == 2 else 600.0 for g in range(8)]
            temps = [95.0 if g == 5 and i >= 2 else 60.0 for g in range(8)]
            if i < 2:  # an older agent's per-GPU events, then a newer one's columns: the plugin and the app see both
                samples: list = [GpuTelemetry(event_time=from_seconds(t0 + i), source=Source(node="n1", gpu=g),
                                              power_w=power[g], temperature_c=temps[g]) for g in range(8)]
            else:
                samples = [GpuSamples(event_time=from_seconds(t0 + i), source=Source(node="n1"), gpus=list(range(8)),
                                      power_w=power, temperature_c=temps)]
            producer.produce(config.topic("gpu_telemetry"), key=b"n1", value=encode_batch(samples))
        producer.flush(10)

        def poll():
            msg = consumer.poll(0.1)
            if msg is not None and not msg.error():
                alerts.extend(a for a in decode(msg.value()).events if isinstance(a, Alert))

        def seen(kind, gpu):
            return any(a.kind == kind and a.subject.node == "n1" and a.subject.gpu == gpu for a in alerts)

        assert wait_for(lambda: seen("power_over_cap", 2) and seen("gpu_too_hot", 5), 60, poll), \
            (alerts, app.poll() is not None and app.stdout.read())
        opened = [a for a in alerts if a.status == "open" and a.kind in ("power_over_cap", "gpu_too_hot")]
        assert sorted((a.kind, a.subject.gpu, a.severity) for a in opened) == [
            ("gpu_too_hot", 5, 3), ("power_over_cap", 2, 3)]
        assert {a.detector for a in opened} == {"power_cap", "hot-gpu"}
    finally:
        consumer.close()
        app.terminate()
        app.wait(20)
        worker.stop()
