"""PpoExtLearner, PpoExtConfig, the loss functions in tunix's signatures, mask-aware passes."""
