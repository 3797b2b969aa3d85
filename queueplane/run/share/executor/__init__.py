"""The share runtime in a Python worker process: fetchers over ShareConsumers, the handler pool,
the outbox of outcome rows not yet reported, and suspects' calls isolated in children."""
