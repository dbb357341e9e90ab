"""A run's settings: the one typed settings model (every flag, probe-config key and
serving-config key with its type and bounds), the merge of flags over a probe config over
defaults, probe-config and serving-config files, and the pipeline's own configs built
from them.
"""
