"""The built-in credit methods, one file each (the interface: ``pipeline.credit.method``)."""
