"""The faces over the library facade (:class:`tracelake.warehouse.Warehouse`): the ``tracelake`` command line,
the REST API, the HTML reports and the scheduler that writes them."""

from tracelake.contracts.allocators import return_freed_memory_promptly
from tracelake.contracts.blas import one_blas_thread

return_freed_memory_promptly()  # before anything loads polars (its allocator reads the setting once)
one_blas_thread()  # before anything loads numpy (OpenBLAS reads its thread count once): these processes are ours
