"""Pretraining tiny models (notebook 06), in rooms: ``tasks`` (the data), ``variants`` (the configurations and the
models they build), ``loop`` (training and the run cache), ``measure`` (what a trained model is asked).
``course.train`` is the one door the notebooks, the CLI and the exercises use."""
