"""Reports from stored results: tables, charts and the HTML site. Imports the core and the
catalog."""
