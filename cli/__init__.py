"""The ``vcsched`` command: parse, call the core, render.  No decisions are made here."""
