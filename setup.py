"""Package metadata for aiter (setup.py stays the build entry; tool settings are in pyproject)."""

from setuptools import find_packages, setup

setup(
    name="aiter",
    version="0.1.0",
    description="FlyDSL GPU operators for AMD Instinct GPUs, with a CPU-only AOT kernel-cache builder",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["aiter", "aiter.*"]),
    package_data={"aiter": ["configs/*.csv"]},
    install_requires=[
        # Exactly the release whose CPU build the Makefile installs first, so pip never swaps it
        # for another (multi-GB) build.
        "torch==2.13.0",
        "flydsl==0.4.2",
        "pandas",
        "ziglang",
    ],
    extras_require={"dev": ["pytest", "hypothesis", "black", "ruff"]},
)
