"""The main job: ``python -m cake.train`` trains a small byte-level language model built from
cake's layers on the Python standard library's source files and shows it (progress bar, loss
curve PNG, JSON log, peak memory); ``--compare fla`` trains the same model with
flash-linear-attention's layers. ``python -m cake.train --help`` explains every option."""
