"""The messaging team's handlers (examples beside email-jobs.yaml)."""
