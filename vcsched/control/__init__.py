"""A live cluster as the core sees it: the inventory read from libvirt, admission of new virtual clusters, and
adaptation of the running ones — each returning a plan, never acting."""
