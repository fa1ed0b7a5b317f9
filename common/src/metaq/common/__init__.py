"""Wire contract, record codec, config and errors shared by all components."""
