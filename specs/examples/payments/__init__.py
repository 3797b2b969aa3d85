"""The payments team's handlers (and its queue spec, payment-events.yaml)."""
