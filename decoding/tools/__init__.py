"""What people run around the decoder: the command line, benchmarks (local and against a
server), the draft-length sweep, the machine probe, head training and metrics pages.

Tools call `decoding.api`; nothing below them imports a tool.
"""
