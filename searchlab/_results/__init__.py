"""The pieces behind :mod:`searchlab.results`; users import ``searchlab.results`` only."""
