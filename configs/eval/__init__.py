"""Evaluation configs (`loopspec-evaluate --config=eval/<name>.py[:preset]`)."""
