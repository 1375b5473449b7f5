"""Support package for the executable book on parallel JAX.

Each module has one job and imports on its own; chapters import what they use, e.g.
``import book.devices``. Nothing here starts the JAX backend at import time.
"""

__version__ = "0.1.0"
