"""The decoder itself: the `Draft` contract, verification, token trees, plain decoding, the
speculative loop, how a round is recorded, and the time budget a request runs under."""
