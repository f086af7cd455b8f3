"""MQTT Topic Name / Topic Filter validation (MQTT 5.0 4.7, 4.8.2) and the subscription trie."""
