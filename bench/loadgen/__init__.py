"""MQTT 3.1.1 / 5.0 load generator on raw asyncio, spread over worker processes.

``plan`` turns a scenario name into client specs, ``worker`` runs a share of the clients in
one process, ``runner`` coordinates the workers through the phases (subscribe, verify the
route, warm up, measure, drain) and ``report`` turns their counts into the figures.
"""
