"""Specs: the JSON Schema, reading YAML files with their line numbers, the rules beyond the schema,
the typed model every later step reads, durations, and the cache of checked files."""
