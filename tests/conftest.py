"""Every test process runs on 8 mock CPU devices, chosen before any test starts JAX."""

import book.devices

book.devices.setup(8)
