"""The broker: the store and request handling."""
