"""Example programs installed with the package: ``tfsyncmodes-train``
(:mod:`tfsyncmodes.examples.train`), the trainer every mode's documentation runs."""
