"""Training configs (`loopspec-train --config=train/<name>.py`, paths relative to configs/)."""
