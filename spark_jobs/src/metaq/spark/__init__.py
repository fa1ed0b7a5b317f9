"""PySpark data source for reading metaq topics."""
