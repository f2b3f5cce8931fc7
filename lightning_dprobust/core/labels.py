"""The privacy records' words for the two randomness modes, in a module without torch so that reading the zoo
catalog (``dprobust zoo list``) needs no torch import."""

SECRET_LABEL = "secret"
SEEDED_LABEL = "reproducibility mode, seed known: no guarantee against whoever holds the config"
"""What every privacy record (console, logger, zoo entry) says of a seeded run: the seed is in its config, and from
it the masks and the noise of every step can be regenerated, so the run's epsilon does not hold against whoever has
read that config."""
