"""The files users give vcsched (instance JSON, cluster and request TOML), parsed and checked, and byte sizes.

Parsing is pure: each parser takes the decoded document (reading files is the
CLI's job) and raises :class:`vcsched.errors.InputError` naming the field and
the value.
"""
