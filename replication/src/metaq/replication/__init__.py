"""Master-to-slave log shipping and failover state machines."""
