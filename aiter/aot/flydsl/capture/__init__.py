"""Serving captures for a build: reading them (`files`), their calls as jobs (`jobs`), and the
`python -m aiter.aot.flydsl.capture merge|suggest` command (`cli`).
"""
