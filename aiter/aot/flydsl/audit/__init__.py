"""The audit after naming: cache entries checked whole (`entries`), and the findings that fail a
job (`findings`: kernels missing or corrupt, points of the dense audit no probe named).
"""
