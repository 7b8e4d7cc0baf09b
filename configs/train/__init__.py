"""Training configs (`experiments/train.py --config=configs/train/<name>.py`)."""
