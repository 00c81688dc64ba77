"""Config kinds and schemas, parsing and validation, the config store and its sources."""
