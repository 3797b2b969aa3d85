"""The payments team's handlers (examples beside payment-events.yaml)."""
