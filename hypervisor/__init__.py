"""The only layer that talks to hypervisors (through libvirt).

Kept separate so the decision core in :mod:`vcsched` stays pure data and can be
tested without any daemon; everything that acts on a host lives here.
"""
