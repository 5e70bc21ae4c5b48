"""Issue #7: the paper's mechanisms reproduced exactly on an enumerable policy (``rpg-mechanisms``)."""
