"""Provision: the plan (a diff of the specs against the live cluster), its apply, and the steps
validate -> plan -> apply that the command line and the Airflow operators both call."""
