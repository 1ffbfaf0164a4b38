"""Kernel templates: search spaces, code generation, build, reference checks and timing.

Templates are looked up by name through ``tunehub.kernels.registry``.
"""
