"""aiter's version, in a module of its own so that light modules read it without the package's
__init__ (the cache lookup runs while `import aiter` is under way)."""

__version__ = "0.1.0"
