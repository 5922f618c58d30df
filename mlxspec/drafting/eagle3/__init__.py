"""EAGLE-3 heads in both published formats: the model, its files and the torch checkpoint reader."""
