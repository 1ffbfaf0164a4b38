"""Measurers: the local sandboxed measurer, the replay double, and (later) Ray workers."""
