"""Kafka plumbing shared by every service: topic names and topic administration."""
