"""Command-line programs of the wheel that sit above the training engine: ``largedet-submit``
(:mod:`.submit`)."""
