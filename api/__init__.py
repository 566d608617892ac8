"""The faces over the library facade (:class:`tracelake.warehouse.Warehouse`): the ``tracelake`` command line,
the REST API, the HTML reports and the scheduler that writes them."""

from tracelake.contracts.allocators import return_freed_memory_promptly

return_freed_memory_promptly()  # before anything loads polars (its allocator reads the setting once)
