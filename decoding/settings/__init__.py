"""What a run is asked to do and where it runs: sampling, draft-length policies, the machine.

The lowest layer of `decoding`: everything may import it, it imports no other part.
"""
