"""Operations on a running queue: hot partitions and keys, the age of the oldest waiting record,
the dead-letter tools (list, redrive), and a realistic test load."""
