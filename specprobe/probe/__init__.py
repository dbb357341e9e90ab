"""The probe pipeline: alignment pre-flight, references (on-policy, cached), teacher-forced
scoring and its collectors (drill-down, what-ifs), shards and torchrun, sweep, and the
assembly of the typed result.
"""
