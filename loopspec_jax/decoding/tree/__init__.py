"""Token trees: one static-shape tree verifier (`verify`) and the tree drafters that feed it (`self_spec`)."""
