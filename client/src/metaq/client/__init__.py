"""Producer, consumer and admin CLI."""
