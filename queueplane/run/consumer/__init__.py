"""Consumer groups: ordered per partition or per key on Spark's Kafka source, retries in place,
offsets committed only past finished records, exactly-once output with KIP-447 transactions."""
