"""Gymnasium simulator of the two staging buffers between the read, network and write stages."""
