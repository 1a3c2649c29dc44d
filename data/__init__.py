"""Small files the labs read, shipped inside the package as ``labkit.data``."""
