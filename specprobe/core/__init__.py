"""What every layer shares and nothing above it owns: the error hierarchy, Ctrl-C/SIGTERM
handling, the progress interface, OpenMP spin settings, safe YAML/JSON parsing, atomic
file writes and output-path checks.
"""
