"""Judging numbers: the metric catalogue, the rule condition grammar, the rules engine over
the data in rules/*.yaml, and the regression gate between two results.
"""
