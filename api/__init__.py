"""The faces over the library facade (:class:`tracelake.warehouse.Warehouse`): the ``tracelake`` command line,
the REST API, the HTML reports and the scheduler that writes them."""
