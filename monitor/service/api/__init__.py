"""JSON API of the paging service (``/api/v1``)."""
