"""Measuring how accurately and how quickly CPU caps take effect.

Caps are the product's only lever on yields, so their precision bounds how
close the measured yields can come to the predicted ones.
"""
