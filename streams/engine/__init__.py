"""The pure stream logic: detection driving, correlation into incidents, decisions.

No Kafka, no ClickHouse, no clock: every function takes its time as an
argument, so the live worker, replays, the simulator and the tests run the
same code. The adapters around it (:mod:`vigil.streams.worker`, the history
sink) move bytes.
"""
