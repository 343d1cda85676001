"""The per-arch replay: naming a job's kernels by bisection in a dry run (`naming`), the arch
process that names and compiles (`arch_process`), and starting those processes from the warm
driver (`spawn`, `operators`).
"""
