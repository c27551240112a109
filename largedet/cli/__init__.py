"""Command-line programs of the wheel that sit above the training engine: ``largedet-submit``
(:mod:`.submit`) and ``largedet-recipe`` (:mod:`.recipe`)."""
