"""Sans-IO MQTT 3.1.1 / 5.0 core: codec, properties, reason codes and protocol errors.

Nothing in this package touches a socket: bytes go in, packets come out, and every rule is
testable with bytes alone (the h11 model, docs/design.md).
"""
