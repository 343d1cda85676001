"""A build's execution in the driver and its arch processes: the command line (`options`), the
fingerprint memo (`fingerprint`, `memo`), the worker processes and their shared budget
(`workers`, `budget`), progress and the summary.
"""
