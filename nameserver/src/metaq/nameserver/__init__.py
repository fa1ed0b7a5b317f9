"""Broker registry, routes, queue assignment and the failover controller host."""
