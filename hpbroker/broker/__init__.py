"""Broker-wide state owned by the arbiter: configuration and the topic store."""
