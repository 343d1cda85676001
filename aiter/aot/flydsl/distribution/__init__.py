"""A build spread over machines and shipped: Ray tasks (`ray_executor`), merging shard caches
(`merge`), and what an installed cache holds (`info`).
"""
