"""The consumer runtime in a Python worker process: its member of the group, each assigned
partition's task, the key slots that call the handler, and the transactional writes."""
