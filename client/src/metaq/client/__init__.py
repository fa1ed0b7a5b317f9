"""metaq's client: producer, consumer, route cache and the ``metaq`` admin CLI."""
