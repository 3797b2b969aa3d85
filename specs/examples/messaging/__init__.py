"""The messaging team's handlers (and its queue spec, email-jobs.yaml)."""
