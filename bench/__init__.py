"""Cormorant's benchmarks: the MQTT load generator (``bench.loadgen``) and the side-by-side
runner against Mosquitto (``python -m bench compare <scenario>``); see bench/README.md."""
